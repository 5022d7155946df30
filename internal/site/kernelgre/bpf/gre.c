// SPDX-License-Identifier: GPL-2.0
//
// deskway site's kernel datapath: GRE in tc. encap runs at the ingress
// of a tenant's veth (the underlay namespace's end) and sends what the
// tenant routed to a site as GRE, segmented once by the kernel (GSO);
// decap runs at the ingress of an underlay interface and hands GRE whose
// peer, key and inner source it knows straight to the tenant's namespace.
// Any GRE else is left to the stack (TC_ACT_OK): deskway's userspace
// datapath reads it on its raw socket and forwards, answers or drops and
// counts it as it does without this program. What a tenant sends is
// never left to the underlay namespace's stack, which would route it
// among the underlay's networks: what goes to no site is dropped and
// counted.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// Kernels from 6.3 take these; Debian 12's headers do not name them.
#define ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)

#define GRE_KEY_ONLY 0x2000 // K set; C, R, S, version 0
#define IP_DF 0x4000
#define IP_MF_OFFSET 0x3fff

// tunnel_key names a tunnel as GRE arrives: the peer's and our address
// (network order) and the key.
struct tunnel_key {
	__u32 peer;
	__u32 local;
	__u32 key;
};

// tunnel_in is where a tunnel's packets go: the tunnel's index (its
// counters and its site's prefixes), the underlay namespace's end of the
// tenant's veth and the two ends' hardware addresses.
struct tunnel_in {
	__u32 tunnel;
	__u32 ifindex;
	__u8 dst_mac[6];
	__u8 src_mac[6];
};

// prefix_key is an LPM key: a tunnel's (sources a site may send from)
// or a tenant's (destinations routed to a site) by index, the family
// (4 or 6), the address.
struct prefix_key {
	__u32 bits;
	__u32 index;
	__u8 family;
	__u8 addr[16];
} __attribute__((packed));

// tunnel_out is how a tenant reaches a site: the outer addresses
// (network order), the key, the underlay interface and the tunnel's index.
struct tunnel_out {
	__u32 local;
	__u32 peer;
	__u32 key;
	__u32 ifindex;
	__u32 tunnel;
};

// counters are a tunnel's, per CPU: packets count the segments a
// superpacket carries.
struct counters {
	__u64 pkts_in, bytes_in, pkts_out, bytes_out;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct tunnel_key);
	__type(value, struct tunnel_in);
} tunnels_in SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct prefix_key);
	__type(value, __u8);
} site_sources SEC(".maps");

// tenants maps the underlay namespace's end of a tenant's veth to the
// tenant's index.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} tenants SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct prefix_key);
	__type(value, struct tunnel_out);
} routes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct counters);
} tunnel_counters SEC(".maps");

// no_route counts, per tenant and CPU, what a tenant sent to no site.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} no_route SEC(".maps");

struct outer {
	struct iphdr ip;
	__be16 flags, proto;
	__be32 key;
};

static __always_inline __u32 segs(struct __sk_buff *skb)
{
	return skb->gso_segs > 1 ? skb->gso_segs : 1;
}

static __always_inline __u16 fold(__u32 c)
{
	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	return ~c;
}

// inner reads the family and the address at offset off (the source's
// or the destination's) of the IP packet after the Ethernet header.
static __always_inline int inner(struct __sk_buff *skb, __u32 l3, int src, struct prefix_key *k)
{
	__u8 v;
	if (bpf_skb_load_bytes(skb, l3, &v, 1))
		return -1;
	if ((v >> 4) == 4) {
		k->family = 4;
		k->bits = 32 + 8 + 32;
		return bpf_skb_load_bytes(skb, l3 + (src ? 12 : 16), k->addr, 4);
	}
	if ((v >> 4) == 6) {
		k->family = 6;
		k->bits = 32 + 8 + 128;
		return bpf_skb_load_bytes(skb, l3 + (src ? 8 : 24), k->addr, 16);
	}
	return -1;
}

SEC("tc")
int encap(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	__u32 *tenant = bpf_map_lookup_elem(&tenants, &ifindex);
	if (!tenant)
		return TC_ACT_SHOT; // a tenant's veth the maps no longer hold
	__u16 proto;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		proto = ETH_P_IP;
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		proto = ETH_P_IPV6;
	else
		return TC_ACT_SHOT; // the tenant's end resolves nothing (its neighbours are permanent)
	struct prefix_key k = {.index = *tenant};
	if (inner(skb, ETH_HLEN, 0, &k))
		return TC_ACT_SHOT;
	// Multicast, broadcast and link-local destinations (the tenant's end
	// soliciting routers, reporting its groups) go to no site and are
	// not counted as the tenant's to none.
	if ((k.family == 4 && k.addr[0] >= 224) ||
	    (k.family == 6 && (k.addr[0] == 0xff || (k.addr[0] == 0xfe && (k.addr[1] & 0xc0) == 0x80))))
		return TC_ACT_SHOT;
	struct tunnel_out *t = bpf_map_lookup_elem(&routes, &k);
	if (!t) {
		__u32 ti = *tenant;
		__u64 *n = bpf_map_lookup_elem(&no_route, &ti);
		if (n)
			*n += 1;
		return TC_ACT_SHOT;
	}
	__u8 tos = 0;
	if (proto == ETH_P_IP)
		bpf_skb_load_bytes(skb, ETH_HLEN + 1, &tos, 1);
	__u32 inlen = skb->len - ETH_HLEN, n = segs(skb);
	struct outer h = {
		.ip = {.version = 4, .ihl = 5, .tos = tos, .frag_off = bpf_htons(IP_DF), .ttl = 64,
		       .protocol = IPPROTO_GRE, .saddr = t->local, .daddr = t->peer},
		.flags = bpf_htons(GRE_KEY_ONLY),
		.proto = bpf_htons(proto),
		.key = bpf_htonl(t->key),
	};
	h.ip.tot_len = bpf_htons(inlen + sizeof(h));
	__u32 c = 0;
	__u16 *w = (__u16 *)&h.ip;
#pragma unroll
	for (int i = 0; i < 10; i++)
		c += w[i];
	h.ip.check = fold(c);
	__u32 ul = t->ifindex, tunnel = t->tunnel;
	// FIXED_GSO: a superpacket's segments are cut to the veth's MTU,
	// the tunnel's, which deskway keeps 24 bytes under the underlay's.
	if (bpf_skb_adjust_room(skb, sizeof(h), BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_GRE))
		return TC_ACT_SHOT;
	__be16 ethp = bpf_htons(ETH_P_IP);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0) ||
	    bpf_skb_store_bytes(skb, 12, &ethp, 2, 0))
		return TC_ACT_SHOT;
	struct counters *cn = bpf_map_lookup_elem(&tunnel_counters, &tunnel);
	if (cn) {
		cn->pkts_out += n;
		cn->bytes_out += inlen;
	}
	return bpf_redirect_neigh(ul, 0, 0, 0);
}

SEC("tc")
int decap(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct outer *o = (void *)(eth + 1);
	if ((void *)(o + 1) > end)
		return TC_ACT_OK;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->protocol != IPPROTO_GRE ||
	    (ip->frag_off & bpf_htons(IP_MF_OFFSET)))
		return TC_ACT_OK;
	// Checksum, routing, sequence, another version: the userspace's.
	if (o->flags != bpf_htons(GRE_KEY_ONLY))
		return TC_ACT_OK;
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;
	__u16 proto = bpf_ntohs(o->proto);
	if (proto == ETH_P_IP)
		flags |= ADJ_ROOM_DECAP_L3_IPV4;
	else if (proto == ETH_P_IPV6)
		flags |= ADJ_ROOM_DECAP_L3_IPV6;
	else
		return TC_ACT_OK;
	struct tunnel_key tk = {.peer = ip->saddr, .local = ip->daddr, .key = bpf_ntohl(o->key)};
	struct tunnel_in *t = bpf_map_lookup_elem(&tunnels_in, &tk);
	if (!t)
		return TC_ACT_OK;
	__u32 l3 = ETH_HLEN + sizeof(*o);
	if (bpf_ntohs(ip->tot_len) < sizeof(*o) + 20)
		return TC_ACT_OK;
	struct prefix_key k = {.index = t->tunnel};
	if (inner(skb, l3, 1, &k) || (k.family == 4) != (proto == ETH_P_IP))
		return TC_ACT_OK;
	if (!bpf_map_lookup_elem(&site_sources, &k))
		return TC_ACT_OK; // spoofed: the userspace drops and counts it
	__u32 tunnel = t->tunnel, ifindex = t->ifindex, n = segs(skb);
	struct ethhdr e = {.h_proto = bpf_htons(proto)};
	__builtin_memcpy(e.h_dest, t->dst_mac, 6);
	__builtin_memcpy(e.h_source, t->src_mac, 6);
	if (bpf_skb_adjust_room(skb, -(int)sizeof(*o), BPF_ADJ_ROOM_MAC, flags))
		return TC_ACT_OK;
	if (bpf_skb_store_bytes(skb, 0, &e, sizeof(e), 0))
		return TC_ACT_SHOT;
	struct counters *cn = bpf_map_lookup_elem(&tunnel_counters, &tunnel);
	if (cn) {
		cn->pkts_in += n;
		cn->bytes_in += skb->len - ETH_HLEN;
	}
	return bpf_redirect_peer(ifindex, 0);
}

char LICENSE[] SEC("license") = "GPL";

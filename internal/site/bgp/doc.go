// Package bgp speaks BGP with a tenant's edge router for deskway site:
// one Speaker per tenant, a GoBGP server whose sockets live in the
// tenant's network namespace, learning the tenant's prefixes into a
// RouteSink and announcing the gateway's own.
package bgp

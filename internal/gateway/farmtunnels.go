package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// farmTunnels keeps the farm's list of tunnels in its database
// (farm.database), so that any node's admin API, and the console behind
// it, lists every node's tunnels and can disconnect any of them. Each
// node writes its own tunnels every farmSyncEvery (one statement for
// all of them) and, in the same round, takes the disconnect requests
// other nodes left on its rows. Rows of a node that stopped writing
// drop out of the list after farmRowStale.
type farmTunnels struct {
	pool *pgxpool.Pool
	node string
	srv  *Server
}

const (
	farmSyncEvery = 2 * time.Second
	farmRowStale  = 15 * time.Second
)

const farmTunnelSchema = `CREATE TABLE IF NOT EXISTS deskway_tunnels (
	node       text NOT NULL,
	id         bigint NOT NULL,
	info       jsonb NOT NULL,
	seen       timestamptz NOT NULL,
	disconnect text,
	PRIMARY KEY (node, id)
)`

// farmNodeName names this node in the farm's list: the host name (a
// Kubernetes pod's name) and a suffix that tells apart two nodes on one
// host.
func farmNodeName() string {
	host, _ := os.Hostname()
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}

func openFarmTunnels(ctx context.Context, dsn string, srv *Server) (*farmTunnels, error) {
	pool, err := openFarmDB(ctx, dsn, "tunnel", farmTunnelSchema)
	if err != nil {
		return nil, err
	}
	return &farmTunnels{pool: pool, node: farmNodeName(), srv: srv}, nil
}

// run writes this node's tunnels and acts on disconnect requests until
// ctx ends, then takes the node's rows out of the list.
func (f *farmTunnels) run(ctx context.Context) {
	defer f.pool.Close()
	tick := time.NewTicker(farmSyncEvery)
	defer tick.Stop()
	for {
		if err := f.sync(ctx); err != nil && ctx.Err() == nil {
			f.srv.peerTrouble.Log(f.srv.log, "farm database: writing this node's tunnels failed", netip.Addr{}, err.Error())
		}
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = f.pool.Exec(dctx, `DELETE FROM deskway_tunnels WHERE node = $1`, f.node)
			cancel()
			return
		case <-tick.C:
		}
	}
}

func (f *farmTunnels) sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tunnels := f.srv.Tunnels()
	ids := make([]int64, len(tunnels))
	infos := make([]string, len(tunnels))
	for i, ti := range tunnels {
		ti.Node = f.node
		b, err := json.Marshal(ti)
		if err != nil {
			return err
		}
		ids[i], infos[i] = int64(ti.ID), string(b)
	}
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM deskway_tunnels WHERE node = $1 AND NOT (id = ANY($2))`, f.node, ids)
	b.Queue(`INSERT INTO deskway_tunnels (node, id, info, seen)
		SELECT $1, i, j::jsonb, now() FROM unnest($2::bigint[], $3::text[]) AS t(i, j)
		ON CONFLICT (node, id) DO UPDATE SET info = excluded.info, seen = now()`, f.node, ids, infos)
	b.Queue(`SELECT id, disconnect FROM deskway_tunnels WHERE node = $1 AND disconnect IS NOT NULL`, f.node)
	b.Queue(`DELETE FROM deskway_tunnels WHERE seen < now() - interval '10 minutes'`)
	res := f.pool.SendBatch(ctx, b)
	defer res.Close()
	for range 2 {
		if _, err := res.Exec(); err != nil {
			return err
		}
	}
	rows, err := res.Query()
	if err != nil {
		return err
	}
	type request struct {
		id     int64
		reason string
	}
	var reqs []request
	for rows.Next() {
		var r request
		if err := rows.Scan(&r.id, &r.reason); err != nil {
			rows.Close()
			return err
		}
		reqs = append(reqs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if _, err := res.Exec(); err != nil {
		return err
	}
	for _, r := range reqs {
		if f.srv.Disconnect(uint32(r.id), r.reason) {
			f.srv.log.Info("tunnel disconnected by administrator at another node", "tunnel", r.id)
		}
	}
	return nil
}

// list is every node's tunnels but this one's, as last written.
func (f *farmTunnels) list(ctx context.Context) ([]TunnelInfo, error) {
	rows, err := f.pool.Query(ctx, `SELECT info FROM deskway_tunnels WHERE node <> $1 AND seen > now() - $2::interval ORDER BY node, id`,
		f.node, farmRowStale.String())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TunnelInfo
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		var ti TunnelInfo
		if err := json.Unmarshal(b, &ti); err != nil {
			return nil, err
		}
		out = append(out, ti)
	}
	return out, rows.Err()
}

// requestDisconnect asks node to disconnect its tunnel id; it reports
// whether the farm's list has that tunnel.
func (f *farmTunnels) requestDisconnect(ctx context.Context, node string, id uint32, reason string) (bool, error) {
	tag, err := f.pool.Exec(ctx, `UPDATE deskway_tunnels SET disconnect = $3 WHERE node = $1 AND id = $2 AND seen > now() - $4::interval`,
		node, int64(id), reason, farmRowStale.String())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

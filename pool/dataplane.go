package pool

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/listener"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/dialer"
	"github.com/farmem/farmem/rdma/tcp"
)

// dataPlane serves this daemon's rdma-tier segments with one-sided
// operations (libibverbs where this build and host have an RDMA device, and
// the TCP fallback on the same port): each exported segment is mapped here
// once and registered under its access key. Safe for concurrent use.
type dataPlane struct {
	srv  *dialer.Server
	l    *listener.Listener // retries accept errors; failing while it does (gossip withholds the tier)
	addr string
	log  *slog.Logger
	tls  *tls.Config // verifies this node's data plane for its own dials; nil: plaintext

	// creds checks a connection's handshake credential (see auth.go);
	// until the pool sets it, every connection is refused.
	creds atomic.Pointer[auth]

	coh *coherenceHost // shared segments' directories (coherence.go)

	mu   sync.Mutex
	maps map[uint64]*device.Mapping
	wg   sync.WaitGroup
}

// dataPlaneConfig is the data plane's server configuration for cfg:
// operations are observed and refusals counted by m.
func dataPlaneConfig(cfg Config, log *slog.Logger, m *metrics) tcp.ServerConfig {
	c := tcp.DefaultConfig()
	c.Logger = log
	c.Observe = m.observeDataPlane
	c.Refused = m.refusedDataPlane
	c.MaxInflightPerConn = cfg.DataMaxInflight
	c.MaxConns = cfg.DataMaxConns
	c.MaxHandshakes = cfg.DataMaxHandshakes
	c.MaxHandshakesPerSource = cfg.DataMaxHandshakesPerSource
	c.MaxConnsPerTenant = cfg.DataMaxConnsPerTenant
	c.FrameTimeout = cfg.DataFrameTimeout
	c.BusyPoll = cfg.DataBusyPoll
	if cfg.DataBusyPoll == 0 {
		c.BusyPoll = -1 // off; tcp's zero means its default
	}
	return c
}

// newDataPlane listens on addr and serves cfg's server there, with its
// Authenticate and Message set to the pool's and over TLS as sec says; ls
// watches its listener.
func newDataPlane(addr string, cfg tcp.ServerConfig, sec dataSecurity, ls *listeners) (*dataPlane, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("data plane on %s: %w (choose another with --data-listen)", addr, err)
	}
	log := cfg.Logger
	dp := &dataPlane{l: ls.wrap(l, listenerData), addr: l.Addr().String(), log: log, tls: sec.client, maps: map[uint64]*device.Mapping{}}
	cfg.TLS = sec.server
	cfg.Authenticate = dp.authenticate // verbs
	cfg.Identify = dp.identify
	// Forwarded ops come from the primary homes of redundant segments:
	// peer daemons, on the sessions their nodes hold here (poold/NODE),
	// not their clients on delegated credentials (poold/NODE/CLIENT).
	cfg.Forwarders = isPeerDaemon
	// One identity's client ids share one share of the reply cache.
	cfg.Tenant = dp.tenant
	dp.coh = newCoherenceHost(log)
	cfg.Message = dp.coh.message
	dp.srv = dialer.NewServer(cfg)
	return dp, nil
}

func (dp *dataPlane) serve() {
	dp.wg.Add(1)
	go func() {
		defer dp.wg.Done()
		if err := dp.srv.Serve(dp.l); err != nil && !errors.Is(err, net.ErrClosed) {
			dp.log.Error("data plane stopped", "err", err)
		}
	}()
}

// export maps a segment's backing and registers it; with a non-nil key
// (a restart) under that key, else under a fresh one, as a copy a peer
// fills from another home (tcp.Server.ExportCopy) if copied is set.
func (dp *dataPlane) export(id uint64, b device.Backing, epoch uint64, key *rdma.Key, copied bool) (rdma.Key, error) {
	m, err := device.Map(b)
	if err != nil {
		return rdma.Key{}, err
	}
	var k rdma.Key
	if key != nil {
		k = *key
		err = dp.srv.ExportKey(id, m.Bytes(), epoch, k)
	} else if copied {
		k, err = dp.srv.ExportCopy(id, m.Bytes(), epoch)
	} else {
		k, err = dp.srv.Export(id, m.Bytes(), epoch)
	}
	if err != nil {
		m.Close()
		return rdma.Key{}, err
	}
	dp.mu.Lock()
	dp.maps[id] = m
	dp.mu.Unlock()
	dp.coh.exported(id, key != nil)
	return k, nil
}

// revoke withdraws a segment and unmaps it once no operation touches it.
func (dp *dataPlane) revoke(id uint64) { dp.withdraw(id, dp.srv.Revoke) }

// fence withdraws a segment whose lease ended or that was freed: as revoke,
// and a client that still holds its key is then told ErrLeaseExpired.
func (dp *dataPlane) fence(id uint64) { dp.withdraw(id, dp.srv.Fence) }

// The steps of moving a segment away from this home (moveout.go): track
// which chunks writes change, take the changed ones, seal against writes,
// (reads too, but reader's: the mover's), undo the seal, and withdraw the segment for good once it lives
// elsewhere, after which operations with its key answer MOVED.
func (dp *dataPlane) track(id uint64, chunk int64) error   { return dp.srv.Track(id, chunk) }
func (dp *dataPlane) dirty(id uint64) ([]byte, int, error) { return dp.srv.Dirty(id) }
func (dp *dataPlane) seal(id uint64, reader string) error  { return dp.srv.Seal(id, reader) }
func (dp *dataPlane) unseal(id uint64) error               { return dp.srv.Unseal(id) }
func (dp *dataPlane) handover(id, token uint64) error      { return dp.srv.Handover(id, token) }
func (dp *dataPlane) moveAway(id uint64)                   { dp.withdraw(id, dp.srv.MoveAway) }

func (dp *dataPlane) withdraw(id uint64, how func(uint64) error) {
	dp.mu.Lock()
	m := dp.maps[id]
	delete(dp.maps, id)
	dp.mu.Unlock()
	if m == nil {
		return
	}
	if err := how(id); err != nil {
		dp.log.Error("withdraw segment from the data plane", "segment", id, "err", err)
	}
	dp.coh.drop(id) // its directory reads the mapping
	m.Close()
}

func (dp *dataPlane) close() error {
	err := dp.srv.Close()
	dp.l.Close()
	dp.wg.Wait()
	dp.coh.close()
	dp.mu.Lock()
	defer dp.mu.Unlock()
	for id, m := range dp.maps {
		m.Close()
		delete(dp.maps, id)
	}
	return err
}

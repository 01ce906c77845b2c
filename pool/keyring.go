package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
)

// keyringFile is where the daemon keeps its gossip keyring after a change
// ('memctl keyring'), so that a restart keeps it.
func (c *Config) keyringFile() string { return filepath.Join(c.DataDir, "gossip.keyring") }

// gossipKeys is the keyring to gossip with: the one kept in the data
// directory after a 'memctl keyring' change, if any, else GossipKeyFile's.
// The kept one wins, as consul's keyring file does: a key removed in a
// rotation must not come back from a key file not yet updated when a node
// restarts. nil without a key file.
func (c *Config) gossipKeys() ([][]byte, error) {
	if c.GossipKeyFile == "" {
		return nil, nil
	}
	path := c.keyringFile()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		path = c.GossipKeyFile
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: gossip keys: %w", ErrConfig, err)
	}
	keys, err := cluster.ParseKeys(b)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip keys in %s: %w", ErrConfig, path, err)
	}
	return keys, nil
}

// saveKeyring writes keys to the data directory's keyring file (mode
// 0600), replacing it whole.
func (c *Config) saveKeyring(keys [][]byte) error {
	path := c.keyringFile()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, cluster.FormatKeys(keys), 0o600); err != nil {
		return fmt.Errorf("keep the gossip keyring: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("keep the gossip keyring: %w", err)
	}
	return nil
}

// Keyring lists or changes the gossip keyring, here and, unless
// req.Local, on every other alive member through its control plane.
func (s *service) Keyring(ctx context.Context, req *poolv1.KeyringRequest) (*poolv1.KeyringResponse, error) {
	if err := s.d.mayChangeKeyring(ctx); err != nil {
		return nil, errs.ToStatus(err)
	}
	cl := s.d.pool.gossip()
	if cl == nil {
		if req.Op == poolv1.KeyringOp_KEYRING_OP_LIST {
			return &poolv1.KeyringResponse{Nodes: []*poolv1.NodeKeyring{{Node: s.d.cfg.Node}}}, nil // no gossip, no keys
		}
		return nil, errs.ToStatus(fmt.Errorf("%w: this daemon gossips with nobody (no --gossip); there is no keyring to change", errs.ErrInvalid))
	}
	if req.Op != poolv1.KeyringOp_KEYRING_OP_LIST {
		if err := cluster.CheckKey(req.Key); err != nil {
			return nil, errs.ToStatus(fmt.Errorf("%w: %w", errs.ErrInvalid, err))
		}
	}
	out := &poolv1.KeyringResponse{Nodes: []*poolv1.NodeKeyring{s.d.keyringHere(req)}}
	if req.Local {
		return out, nil
	}
	fwd := &poolv1.KeyringRequest{Op: req.Op, Key: req.Key, Local: true}
	for _, m := range cl.Members() {
		if m.Name == s.d.cfg.Node {
			continue
		}
		nk := &poolv1.NodeKeyring{Node: m.Name}
		out.Nodes = append(out.Nodes, nk)
		if m.State != cluster.StateAlive || m.MetaErr != nil || m.Meta.GRPCAddr == "" {
			nk.Error = fmt.Sprintf("%s: not reached; when it is back, run the same command on it with --local", cluster.StateString(m.State))
			continue
		}
		resp, err := s.d.forwardKeyring(ctx, m, fwd)
		switch {
		case err != nil:
			nk.Error = err.Error()
		case len(resp.Nodes) != 1 || resp.Nodes[0].Node != m.Name:
			nk.Error = "answered for another node"
		default:
			out.Nodes[len(out.Nodes)-1] = resp.Nodes[0]
		}
	}
	return out, nil
}

// forwardKeyring asks member m to apply req to its own keyring.
func (d *Daemon) forwardKeyring(ctx context.Context, m cluster.Member, req *poolv1.KeyringRequest) (*poolv1.KeyringResponse, error) {
	pc, err := d.pool.peerConns().get(ctx, m.Name, m.Meta.GRPCAddr)
	if err != nil {
		return nil, err
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := pc.API().Keyring(cctx, req)
	return resp, errs.FromStatus(err)
}

// keyringHere applies req to this daemon's keyring, keeps the result in
// the data directory, and describes the keyring (or the failure).
func (d *Daemon) keyringHere(req *poolv1.KeyringRequest) *poolv1.NodeKeyring {
	cl := d.pool.gossip()
	nk := &poolv1.NodeKeyring{Node: d.cfg.Node}
	var err error
	switch req.Op {
	case poolv1.KeyringOp_KEYRING_OP_LIST:
	case poolv1.KeyringOp_KEYRING_OP_INSTALL:
		err = cl.InstallKey(req.Key)
	case poolv1.KeyringOp_KEYRING_OP_USE:
		err = cl.UseKey(req.Key)
	case poolv1.KeyringOp_KEYRING_OP_REMOVE:
		err = cl.RemoveKey(req.Key)
	default:
		err = fmt.Errorf("%w: keyring operation %v; use list, install, use or remove", errs.ErrInvalid, req.Op)
	}
	keys := cl.Keys()
	if err == nil && req.Op != poolv1.KeyringOp_KEYRING_OP_LIST {
		if err = d.cfg.saveKeyring(keys); err == nil {
			d.log.Info("gossip keyring changed", "op", req.Op.String(), "key", cluster.Fingerprint(req.Key), "keys", len(keys))
		}
	}
	if err != nil {
		nk.Error = err.Error()
	}
	for _, k := range keys {
		nk.Fingerprints = append(nk.Fingerprints, cluster.Fingerprint(k))
	}
	return nk
}

// mayChangeKeyring admits the callers that may see and change the gossip
// keyring: administrators (Config.Admins; everyone on plaintext TCP with
// --insecure) and cluster members' node certificates (another daemon
// forwarding a change). Application identities may not: with a key of
// their own installed they could join the cluster.
func (d *Daemon) mayChangeKeyring(ctx context.Context) error {
	c, _ := identityOf(ctx)
	if d.cfg.isAdmin(c.ident, c.gid, c.local) {
		return nil
	}
	if node, ok := strings.CutPrefix(c.ident, "cn:"); ok && d.pool.gossip() != nil {
		if _, member := d.pool.gossip().Member(node); member {
			return nil
		}
	}
	return fmt.Errorf("%w: the gossip keyring is for administrators (poold --admin) and cluster members' node certificates, not %s", errs.ErrAccessDenied, c.ident)
}

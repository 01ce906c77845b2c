package pool

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/errs"
)

// Identities: who is at the other end of a control-plane connection, as the
// transport proved it. A client id (Hello.client_id) is bound to the
// identity that first opened a session with it; segments are owned by
// client ids, so through the binding they belong to that identity.
const (
	identityInsecure = "insecure" // plaintext TCP (--insecure): nothing proved
	identityDefault  = "default"  // the quotas key that applies to every identity without its own
)

// uidIdentity is the identity of a local client.
func uidIdentity(uid uint32) string { return fmt.Sprintf("uid:%d", uid) }

// identityOf is who the transport of the gRPC peer of ctx proved the
// caller to be (its client unset): uid:N on the unix socket, cn:NAME over
// mutual TLS, insecure on plaintext TCP; and the uid of a local caller.
func identityOf(ctx context.Context) (c caller, uid uint32) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return caller{ident: identityInsecure}, 0
	}
	switch ai := p.AuthInfo.(type) {
	case peerInfo:
		return localCaller(ai), ai.UID
	case credentials.TLSInfo:
		if cn := certs.Identity(ai.State); cn != "" {
			return caller{ident: "cn:" + cn, node: certs.ServesTLS(ai.State)}, 0
		}
	}
	return caller{ident: identityInsecure}, 0
}

// localCaller is a unix-socket peer's identity.
func localCaller(p peerInfo) caller {
	return caller{ident: uidIdentity(p.UID), gid: p.GID, local: true, pid: p.PID}
}

// allowLocal checks a local peer against the allow lists (Config.AllowUIDs,
// Config.AllowGIDs).
func (c *Config) allowLocal(p peerInfo) error {
	if slices.Contains(c.AllowUIDs, p.UID) || slices.Contains(c.AllowGIDs, p.GID) {
		return nil
	}
	return fmt.Errorf("uid %d (gid %d) is not in the allow list (uids %v, gids %v); add it with --allow-uid or --allow-gid", p.UID, p.GID, c.AllowUIDs, c.AllowGIDs)
}

// bucketIdentities maps client ids to the identity they are bound to;
// bucketBindings keeps the number of the latest binding (nextBinding).
var (
	bucketIdentities = []byte("identities")
	bucketBindings   = []byte("bindings")
	keyLastBinding   = []byte("last")
)

// auth holds the client-id bindings and the data-plane credentials of live
// sessions. It is safe for concurrent use.
type auth struct {
	st *store // nil in tests without a store: bindings are not persisted

	once  sync.Once
	mu    sync.Mutex
	bound map[string]string // client id -> identity
	// bindings numbers each binding in bound, larger for a later one
	// (nextBinding): a home tells one binding's delegated credentials
	// from the next one's by it (DelegateRequest.binding).
	bindings    map[string]uint64
	lastBinding uint64
	// self is the daemon's own data-plane credential (the tier probe).
	self []byte
	// forgotten are bindings dropped in memory, not yet in the store.
	forgotten []string
	creds     map[string]dataCred
	// byClient is the latest live credential of each client id.
	byClient map[string][]byte
	// delegated counts the credentials each peer session holds for its
	// clients (at most maxDelegated).
	delegated map[string]int
	// disconnect closes the data-plane connections that act for a
	// principal but those whose tenant keep accepts
	// (tcp.Server.Disconnect); nil without a data plane (closeConns).
	disconnect func(principal string, keep func(tenant string) bool) int
}

// dataCred is a data-plane credential: 128 random bits issued to one
// session, or delegated over a peer's session to one of its clients, and
// accepted until that session ends. client is the principal the data plane
// checks segments against (a client id, or a delegated principal), identity
// the one its certificate must name when a connection presents one, and
// tenant whose share of the data plane's reply cache its sessions count
// against (tenant).
type dataCred struct {
	session  string
	client   string
	identity string
	tenant   string
	// binding is, for a delegated credential, the asking daemon's
	// binding of the client id it was delegated for (0: not said).
	binding uint64
}

func (a *auth) load() {
	a.once.Do(func() {
		a.bound = map[string]string{}
		a.bindings = map[string]uint64{}
		a.creds = map[string]dataCred{}
		a.byClient = map[string][]byte{}
		a.delegated = map[string]int{}
		if a.st == nil {
			return
		}
		a.st.db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(bucketBindings); b != nil {
				if v := b.Get(keyLastBinding); len(v) == 8 {
					a.lastBinding = binary.BigEndian.Uint64(v)
				}
			}
			b := tx.Bucket(bucketIdentities)
			if b == nil {
				return nil
			}
			return b.ForEach(func(k, v []byte) error {
				a.bound[string(k)] = string(v)
				a.bindings[string(k)] = a.nextBinding()
				return nil
			})
		})
		if len(a.bound) > 0 {
			// The numbers just given are this run's: the next run's
			// start above them, whatever its clock says (best effort: a
			// store that cannot commit this fails the next binding).
			last := binary.BigEndian.AppendUint64(nil, a.lastBinding)
			a.st.update(func(tx *bolt.Tx) error { return putBindingMark(tx, last) }, false)
		}
	})
}

// putBindingMark stores last, the number of the latest binding.
func putBindingMark(tx *bolt.Tx, last []byte) error {
	b, err := tx.CreateBucketIfNotExists(bucketBindings)
	if err != nil {
		return err
	}
	return b.Put(keyLastBinding, last)
}

// bind binds a client id to ident on its first session, and refuses a
// session for a client id bound to another identity: one identity cannot
// take over another's segments by naming its client id, nor, once the id
// is bound anew, keep the data-plane connections it opened under it.
func (a *auth) bind(clientID, ident string) error {
	a.load()
	a.mu.Lock()
	had, ok := a.bound[clientID]
	if ok {
		a.mu.Unlock()
		if had != ident {
			return fmt.Errorf("%w: client id %q belongs to identity %s, not %s; dial with another client id (alloc.WithClientID)", errs.ErrAccessDenied, clientID, had, ident)
		}
		return nil
	}
	a.bound[clientID] = ident
	a.bindings[clientID] = a.nextBinding()
	// The id's binding was forgotten (its lease ran out): the connections
	// an earlier holder of another identity left open would act for this
	// one. Cut before its credential is issued.
	a.closeConns(clientID, keepTenant(tenantOf(clientID, ident)))
	gone := a.forgotten
	a.forgotten = nil
	last := binary.BigEndian.AppendUint64(nil, a.lastBinding)
	a.mu.Unlock()
	if a.st == nil {
		return nil
	}
	err := a.st.update(func(tx *bolt.Tx) error {
		if err := putBindingMark(tx, last); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(bucketIdentities)
		if err != nil {
			return err
		}
		for _, id := range gone {
			a.mu.Lock()
			_, again := a.bound[id]
			a.mu.Unlock()
			if !again {
				if err := b.Delete([]byte(id)); err != nil {
					return err
				}
			}
		}
		return b.Put([]byte(clientID), []byte(ident))
	}, false)
	if err != nil {
		a.mu.Lock()
		delete(a.bound, clientID)
		delete(a.bindings, clientID)
		a.mu.Unlock()
		return fmt.Errorf("bind client %q to %s: commit to the metadata store: %w", clientID, ident, err)
	}
	return nil
}

// forget drops a client id's binding (its lease ran out and it holds
// nothing) and returns its number (0 if it had none). The store forgets
// it with the next binding's commit, so that forget, called under the
// pool's mutex, never waits for a commit.
func (a *auth) forget(clientID string) uint64 {
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.bound[clientID]; !ok {
		return 0
	}
	n := a.bindings[clientID]
	delete(a.bound, clientID)
	delete(a.bindings, clientID)
	a.forgotten = append(a.forgotten, clientID)
	return n
}

// identity is the identity a client id is bound to ("" if none).
func (a *auth) identity(clientID string) string {
	ident, _ := a.binding(clientID)
	return ident
}

// binding is the identity a client id is bound to and the binding's
// number ("" and 0 if none).
func (a *auth) binding(clientID string) (ident string, n uint64) {
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bound[clientID], a.bindings[clientID]
}

// nextBinding numbers a new binding; a.mu is held (or load runs). The
// numbers are nanoseconds of the wall clock, made to grow strictly from
// the last one, which the store keeps with each new binding: a binding
// made after a restart of this daemon is numbered above those of its
// previous run, whose credentials a home may still hold until that run's
// session with it ends there, also when the clock was set back meanwhile.
func (a *auth) nextBinding() uint64 {
	a.lastBinding = max(a.lastBinding+1, uint64(time.Now().UnixNano()))
	return a.lastBinding
}

// boundTo counts the client ids of ids bound to ident (none for "").
func (a *auth) boundTo(ids []string, ident string) int {
	if ident == "" || ident == identityInsecure {
		return 0 // nothing proved: not one identity's
	}
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, id := range ids {
		if a.bound[id] == ident {
			n++
		}
	}
	return n
}

// owners returns the client ids bound to ident.
func (a *auth) owners(ident string) []string {
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for id, i := range a.bound {
		if i == ident {
			out = append(out, id)
		}
	}
	return out
}

// issue makes the data-plane credential of a new session; its tenant is
// the session's identity (tenantOf).
func (a *auth) issue(session, clientID, ident string) []byte {
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.issueLocked(dataCred{session: session, client: clientID, identity: ident, tenant: tenantOf(clientID, ident)})
}

// tenantOf is the tenant (rdma/tcp ServerConfig.Tenant) of the data-plane
// sessions of a client id holding identity ident: the identity, whose
// client ids share one share of the reply cache, except where it proves
// nothing (--insecure: every client is "insecure") and for a peer
// daemon's own sessions (poold/NODE), which carry its forwarded ops and
// keep a share of their own rather than one with clients whose
// certificate names the node: "" then, each client id its own tenant.
func tenantOf(clientID, ident string) string {
	if ident == identityInsecure || isPeerDaemon(clientID) {
		return ""
	}
	return ident
}

// issueLocked makes a data-plane credential; a.mu is held.
func (a *auth) issueLocked(c dataCred) []byte {
	b := make([]byte, 16)
	rand.Read(b)
	a.creds[string(b)] = c
	a.byClient[c.client] = b
	return b
}

// revokeSession withdraws the credentials of a session and those
// delegated over it: new data-plane connections presenting them are
// refused.
func (a *auth) revokeSession(session string) {
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.delegated, session)
	for k, c := range a.creds {
		if c.session != session {
			continue
		}
		delete(a.creds, k)
		if string(a.byClient[c.client]) == k {
			delete(a.byClient, c.client)
		}
	}
	for k, o := range a.creds { // another live session of each client
		if _, ok := a.byClient[o.client]; !ok {
			a.byClient[o.client] = []byte(k)
		}
	}
}

// delegate issues the credential of client of the peer daemon whose
// client id here is peer and whose session this is (its principal is
// delegatedPrincipal), with the identity the peer proved for it and the
// number of the peer's binding of the client id (0: not said); asked
// again for the same identity and binding, it returns the same one. For
// another identity it withdraws that one and issues a new one; for a
// later binding of the same identity too (the peer's lease of the old one
// ran out), keeping the connections opened with it, which act for the
// same identity; a binding older than one already delegated over this
// session is a request that came late, refused. Its tenant is that
// identity if a certificate proved it (cn:NAME, one holder across the
// cluster), else the identity on that peer ("poold/A uid:N"): a uid, or
// insecure, names someone only on the host that saw it.
func (a *auth) delegate(session, peer, client, ident string, binding uint64) ([]byte, error) {
	principal := delegatedPrincipal(peer, client)
	tenant := tenantOf(principal, ident)
	if tenant != "" && !strings.HasPrefix(ident, "cn:") {
		tenant = peer + " " + ident
	}
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.creds {
		if c.client == principal && c.session == session && binding != 0 && c.binding > binding {
			return nil, fmt.Errorf("%w: client %q's binding %d at the calling daemon is older than binding %d, delegated over the same session: the request came after the binding ended there", errs.ErrLeaseExpired, client, binding, c.binding)
		}
	}
	var same []byte
	withdrew := false
	for k, c := range a.creds {
		if c.client != principal {
			continue
		}
		if c.identity == ident {
			switch {
			case binding != 0 && c.binding < binding:
				// The same identity bound the id anew at the peer:
				// the old binding's credential, which a withdrawal
				// of that binding will come for, is not handed out
				// again. Its connections act for the same identity
				// and stay.
				a.withdrawLocked(k, c)
			case c.session == session && (binding == 0 || c.binding == binding):
				same = []byte(k)
			}
			continue
		}
		// The peer's client id is bound to another identity now (the
		// old binding was reaped there): a credential of the old one,
		// over this session of the peer's or another still open,
		// speaks for nobody.
		a.withdrawLocked(k, c)
		withdrew = true
	}
	var cred []byte
	var err error
	switch {
	case same != nil:
		cred = same
	case a.delegated[session] >= maxDelegated:
		err = fmt.Errorf("%w: the peer session holds %d delegated credentials already, the most one may", errs.ErrLimit, maxDelegated)
	default:
		a.delegated[session]++
		cred = a.issueLocked(dataCred{session: session, client: principal, identity: ident, tenant: tenant, binding: binding})
	}
	if withdrew || same == nil {
		// Nor do the connections opened with them, or with a credential
		// of another identity that an earlier session of the peer's
		// took with it, which would act for this identity: they are cut
		// before its credential is handed out, here or to a concurrent
		// ask. Their tenant, named after their identity, tells them
		// apart (--insecure's, "", proves none).
		a.closeConns(principal, keepTenant(tenant))
	}
	return cred, err
}

// undelegate withdraws the credentials delegated to client of the peer
// daemon whose client id here is peer, over any of its sessions, for the
// peer's binding of the id numbered binding and earlier ones (every one
// for 0), and closes their connections unless a later binding's credential
// stands (its delegation cut those of other identities): the peer forgot
// that binding of the client id.
func (a *auth) undelegate(peer, client string, binding uint64) {
	principal := delegatedPrincipal(peer, client)
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	later := false
	for k, c := range a.creds {
		switch {
		case c.client != principal:
		case binding != 0 && c.binding > binding:
			later = true
		default:
			a.withdrawLocked(k, c)
		}
	}
	if !later {
		a.closeConns(principal, nil)
	}
}

// withdrawLocked withdraws delegated credential k (c); a.mu is held.
func (a *auth) withdrawLocked(k string, c dataCred) {
	delete(a.creds, k)
	if string(a.byClient[c.client]) == k {
		delete(a.byClient, c.client)
	}
	a.delegated[c.session]--
}

// closeConns closes the data-plane connections that act for principal
// but those whose tenant keep accepts (nil keeps none). It may run with
// a.mu held: the data plane calls identify and tenant only outside its
// own lock.
func (a *auth) closeConns(principal string, keep func(tenant string) bool) {
	if a.disconnect != nil {
		a.disconnect(principal, keep)
	}
}

// keepTenant accepts the connections of tenant, the holder's now.
func keepTenant(tenant string) func(string) bool {
	return func(t string) bool { return t == tenant }
}

// tenant is the tenant of the data-plane sessions of principal (rdma/tcp
// ServerConfig.Tenant): the identity its live credential was issued for,
// so that one identity's many client ids share one share of the reply
// cache; "" (the principal is its own) without a live credential.
func (a *auth) tenant(principal string) string {
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.creds[string(a.byClient[principal])].tenant
}

// identify is the data plane's check of a handshake (rdma/tcp
// ServerConfig.Identify): the credential must be a live session's, and
// when the connection presents a client certificate it must name the
// identity the credential was issued for. It returns the credential's
// principal and tenant.
func (a *auth) identify(cred []byte, cert *x509.Certificate) (principal, tenant string, err error) {
	c, err := a.lookup(cred)
	if err != nil {
		return "", "", err
	}
	if cert != nil && c.identity != "cn:"+cert.Subject.CommonName {
		return "", "", fmt.Errorf("%w: the data-plane credential was issued to %s (client %q) and the connection's certificate names cn:%s; present your own credential over your own certificate", errs.ErrAccessDenied, c.identity, c.client, cert.Subject.CommonName)
	}
	return c.client, c.tenant, nil
}

// authenticate is the data plane's check of a handshake credential
// (rdma/tcp ServerConfig.Authenticate).
func (a *auth) authenticate(cred []byte) error {
	_, err := a.lookup(cred)
	return err
}

// lookup finds a live credential.
func (a *auth) lookup(cred []byte) (dataCred, error) {
	a.load()
	if len(cred) != 16 {
		return dataCred{}, fmt.Errorf("%w: data-plane credential of %d bytes; present the 16-byte credential of a live session (Welcome.data_credential)", errs.ErrAccessDenied, len(cred))
	}
	a.mu.Lock()
	c, ok := a.creds[string(cred)]
	a.mu.Unlock()
	if ok {
		return c, nil
	}
	return dataCred{}, fmt.Errorf("%w: the data-plane credential is no live session's (it ended, or it was never issued); reconnect to poold for a fresh one", errs.ErrAccessDenied)
}

// authenticate is the data plane's handshake check for verbs peers.
func (dp *dataPlane) authenticate(cred []byte) error {
	a := dp.creds.Load()
	if a == nil {
		return fmt.Errorf("%w: the daemon is starting; retry", errs.ErrUnavailable)
	}
	return a.authenticate(cred)
}

// identify is the data plane's handshake check for tcp clients; a refusal
// for a certificate that names another identity is logged.
func (dp *dataPlane) identify(cred []byte, cert *x509.Certificate) (principal, tenant string, err error) {
	a := dp.creds.Load()
	if a == nil {
		return "", "", fmt.Errorf("%w: the daemon is starting; retry", errs.ErrUnavailable)
	}
	principal, tenant, err = a.identify(cred, cert)
	if err != nil && cert != nil {
		dp.log.Warn("data-plane connection refused", "certificate", "cn:"+cert.Subject.CommonName, "err", err)
	}
	return principal, tenant, err
}

// startAuth connects the data plane's handshake check to the sessions'
// credentials, issues the daemon's own (for its tier probe), and takes the
// node certificate for calls to peers.
func (p *core) startAuth() error {
	tc, err := p.cfg.peerTLS()
	if err != nil {
		return err
	}
	p.peers.tls = tc
	p.auth.self = p.auth.issue("", "", "poold")
	if p.dp != nil {
		p.auth.disconnect = p.dp.srv.Disconnect
		p.dp.creds.Store(&p.auth)
	}
	return nil
}

// tenant is the data plane's ServerConfig.Tenant; "" while the daemon
// starts.
func (dp *dataPlane) tenant(principal string) string {
	if a := dp.creds.Load(); a != nil {
		return a.tenant(principal)
	}
	return ""
}

// credOf is a live data-plane credential of the client's (nil if none).
func (a *auth) credOf(clientID string) []byte {
	a.load()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byClient[clientID]
}

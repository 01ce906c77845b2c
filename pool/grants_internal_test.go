package pool

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// TestGrantsMigration: a named record written before grants existed gets,
// at start, its owner's identity as creator and the identities of the
// clients that had attached it as grants, committed once; so sharing that
// worked goes on, and another identity is refused. A record whose owner's
// identity is unknown (an administrator's) admits only administrators and
// its past attachers.
func TestGrantsMigration(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	for id, ident := range map[string]string{"app": "uid:1000", "reader": "cn:reader", "other": "cn:other"} {
		require.NoError(t, p.auth.bind(id, ident))
	}
	p.openSession("s1", "app", "", "app", 1, 1000)
	app, err := p.callerFor("s1")
	require.NoError(t, err)
	shared, err := p.Alloc(t.Context(), app, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "shared"})
	require.NoError(t, err)
	orphan, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "orphan"})
	require.NoError(t, err)
	require.NoError(t, p.close())

	// Rewrite both as an older poold wrote them: no grant fields, and the
	// reader attached.
	st, err := openStore(cfg.DataDir, false)
	require.NoError(t, err)
	for _, r := range []*record{shared, orphan} {
		r.Creator, r.Allow, r.AllowFree, r.Grants = "", nil, nil, false
		r.Attached = []string{"reader"}
		require.NoError(t, st.put(r))
	}
	require.NoError(t, st.close())

	p = newTestPool(t, cfg)
	defer p.close()
	got, err := p.Stat(shared.ID)
	require.NoError(t, err)
	require.Equal(t, "uid:1000", got.Creator)
	require.Equal(t, []string{"cn:reader"}, got.Allow)
	require.True(t, got.Grants)
	got, err = p.Stat(orphan.ID)
	require.NoError(t, err)
	require.Empty(t, got.Creator)
	require.Equal(t, []string{"cn:reader"}, got.Allow)

	err = p.st.fileFor(shared).db.View(func(tx *bolt.Tx) error {
		r, _, err := decodeRecord(tx.Bucket(bucketSegments).Get(idKey(shared.ID)))
		require.NoError(t, err)
		require.Equal(t, "uid:1000", r.Creator, "the migration is committed")
		return nil
	})
	require.NoError(t, err)

	as := func(clientID, ident string) caller {
		return caller{client: &client{id: clientID}, ident: ident}
	}
	for _, name := range []string{"shared", "orphan"} {
		_, err = p.Attach(as("reader-2", "cn:reader"), name)
		require.NoError(t, err, "a past attacher's identity keeps access to %s", name)
		_, err = p.Attach(as("other", "cn:other"), name)
		require.ErrorIs(t, err, errs.ErrAccessDenied, name)
	}
	_, err = p.Attach(as("app-2", "uid:1000"), "shared")
	require.NoError(t, err, "the owner's identity is the creator")
	_, err = p.Attach(admin(), "orphan")
	require.NoError(t, err)
}

// TestAttachersBounded: a segment lists at most maxAttachers client ids
// as attached, refusing more with ErrLimit (one already attached attaches
// again); a detach makes room, and so does the end of an attacher's lease,
// which also ends its access: whoever opens a session with its client id
// next must be granted attach again.
func TestAttachersBounded(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	defer p.close()
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	require.NoError(t, p.auth.bind("app", "uid:1000"))
	p.openSession("s-app", "app", "", "app", 1, 1000)
	app, err := p.callerFor("s-app")
	require.NoError(t, err)
	app.ident = "uid:1000"
	seg, err := p.Alloc(t.Context(), app, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "shared"})
	require.NoError(t, err)

	attacher := func(id, ident string) caller { return identCaller(t, p, id, ident) }
	first := attacher("first", "uid:1000")
	_, err = p.Attach(first, "shared")
	require.NoError(t, err)
	p.mu.Lock()
	for i := len(p.segs[seg.ID].Attached); i < maxAttachers; i++ {
		p.segs[seg.ID].Attached = append(p.segs[seg.ID].Attached, fmt.Sprintf("gone-%d", i))
	}
	p.mu.Unlock()

	one := attacher("one-more", "uid:1000")
	_, err = p.Attach(one, "shared")
	require.ErrorIs(t, err, errs.ErrLimit)
	require.ErrorContains(t, err, "detach")
	_, err = p.Attach(first, "shared")
	require.NoError(t, err, "an attacher attaches again")
	require.NoError(t, p.Detach(first, seg.ID))
	_, err = p.Attach(one, "shared")
	require.NoError(t, err, "a detach makes room")

	// one-more's lease ends: its attachment with it, and the credentials
	// homes delegated to it.
	p.deleg.put("home-b", "s-peer-b", "one-more", "uid:1000", 0, []byte("delegated to uid:1000"))
	require.NotNil(t, p.deleg.get("home-b", "s-peer-b", "one-more", "uid:1000", 0))
	require.Nil(t, p.deleg.get("home-b", "s-peer-b", "one-more", "uid:2000", 0), "a credential asked for another identity is not this one's")
	p.closeSession("s-one-more")
	now = now.Add(cfg.LeaseTTL)
	p.reap()
	got, err := p.Stat(seg.ID)
	require.NoError(t, err)
	require.False(t, slices.Contains(got.Attached, "one-more"))
	require.Equal(t, maxAttachers-1, len(got.Attached))
	require.Empty(t, p.auth.identity("one-more"), "reap forgot the binding of a client that owns nothing")
	require.Nil(t, p.deleg.get("home-b", "s-peer-b", "one-more", "uid:1000", 0), "and the credentials delegated to it, which homes issued for its old identity")
	_, err = p.Attach(attacher("one-more", "uid:2000"), "shared")
	require.ErrorIs(t, err, errs.ErrAccessDenied, "another identity with the reaped client's id gets no access")
}

// TestAttachersPerIdentity: one granted identity attaches a segment under
// client id after client id while its list is less than half full; then
// an identity holding maxAttachersPerIdentity places or more is refused
// with ErrLimit, so another granted identity still attaches, and clients
// that prove no identity (--insecure) are not counted as one.
func TestAttachersPerIdentity(t *testing.T) {
	p := newTestPool(t, testConfig(t))
	defer p.close()
	require.NoError(t, p.auth.bind("app", "uid:1000"))
	p.openSession("s-app", "app", "", "app", 1, 1000)
	app, err := p.callerFor("s-app")
	require.NoError(t, err)
	app.ident = "uid:1000"
	seg, err := p.Alloc(t.Context(), app, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "shared", Allow: []string{"cn:mallory", "cn:bob", "cn:carol"}})
	require.NoError(t, err)

	attacher := func(id, ident string) caller { return identCaller(t, p, id, ident) }
	// While the list is less than half full an identity attaches from as
	// many client ids as it likes: a service with many processes of one
	// user.
	const carols = 200
	for i := range carols {
		_, err := p.Attach(attacher(fmt.Sprintf("carol-%d", i), "cn:carol"), "shared")
		require.NoError(t, err, "carol's attacher %d, the list less than half full", i)
	}
	var mallory []caller
	for i := range maxAttachers {
		c := attacher(fmt.Sprintf("mallory-%d", i), "cn:mallory")
		if _, err = p.Attach(c, "shared"); err != nil {
			break
		}
		mallory = append(mallory, c)
	}
	require.ErrorIs(t, err, errs.ErrLimit)
	require.ErrorContains(t, err, "cn:mallory")
	require.ErrorContains(t, err, "detach")
	require.Len(t, mallory, maxAttachers/2-carols, "mallory is refused once the list is half full")

	_, err = p.Attach(attacher("bob", "cn:bob"), "shared")
	require.NoError(t, err, "another identity attaches past mallory's client ids")
	_, err = p.Attach(attacher("carol-again", "cn:carol"), "shared")
	require.ErrorIs(t, err, errs.ErrLimit, "carol holds more than her share of a half-full list")
	for i := range 2 {
		require.NoError(t, p.auth.bind(fmt.Sprintf("insecure-%d", i), identityInsecure))
	}
	require.Zero(t, p.auth.boundTo([]string{"insecure-0", "insecure-1"}, identityInsecure), "clients that prove no identity are not one identity")
	require.NoError(t, p.Detach(mallory[0], seg.ID))
	got, err := p.Stat(seg.ID)
	require.NoError(t, err)
	require.Len(t, got.Attached, maxAttachers/2)
}

// TestAttachmentEndsAfterRestart: a restarted daemon gives each client it
// finds attached to a segment a lease from its start, as it does owners:
// an attacher that never comes back loses its attachment when that lease
// runs out, so the list (at most maxAttachers) does not keep it for good.
func TestAttachmentEndsAfterRestart(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	open := func(id string) caller { return identCaller(t, p, id, "uid:1000") }
	seg, err := p.Alloc(t.Context(), open("app"), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "shared"})
	require.NoError(t, err)
	_, err = p.Attach(open("att"), "shared")
	require.NoError(t, err)
	p.close()

	p = newTestPool(t, cfg)
	defer p.close()
	got, err := p.Stat(seg.ID)
	require.NoError(t, err)
	require.Contains(t, got.Attached, "att")
	later := time.Now().Add(cfg.LeaseTTL + restartGrace + time.Second)
	p.now = func() time.Time { return later }
	p.reap()
	got, err = p.Stat(seg.ID)
	require.NoError(t, err, "the named segment stays")
	require.NotContains(t, got.Attached, "att", "the attacher that did not come back is detached")
}

// TestReapKeepsClientWhoseDetachFailed: a reap that cannot commit the end
// of an expired client's attachment keeps the client, expired, and its
// binding for the next sweep: forgotten, the binding would go while the
// store still listed the client id attached, and whoever took the id
// next would inherit the attachment.
func TestReapKeepsClientWhoseDetachFailed(t *testing.T) {
	p := newTestPool(t, testConfig(t))
	defer p.close()
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	owner := identCaller(t, p, "owner", "uid:1000")
	seg, err := p.Alloc(t.Context(), owner, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "shared", Allow: []string{"uid:2000"}})
	require.NoError(t, err)
	_, err = p.Attach(identCaller(t, p, "gone", "uid:2000"), "shared")
	require.NoError(t, err)
	p.closeSession("s-gone")
	now = now.Add(p.cfg.LeaseTTL)

	f := p.st.storeFile
	f.mu.Lock()
	f.inject = func(bool) error { return errors.New("injected: the disk refused the detach") }
	f.mu.Unlock()
	p.reap()
	require.Equal(t, "uid:2000", p.auth.identity("gone"), "the binding stays while the store lists the attachment")
	got, err := p.Stat(seg.ID)
	require.NoError(t, err)
	require.Contains(t, got.Attached, "gone")

	f.mu.Lock()
	f.inject = nil
	f.mu.Unlock()
	p.reap()
	got, err = p.Stat(seg.ID)
	require.NoError(t, err)
	require.NotContains(t, got.Attached, "gone", "the next sweep ends the attachment")
	require.Empty(t, p.auth.identity("gone"), "and forgets the binding")
}

package pool

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/farmem/farmem/internal/errs"
)

// Authorization of names. A named segment records its creator's identity
// (record.Creator) and the identities the creator granted: Allow may
// attach it, AllowFree may attach and free it. An identity is what the
// transport proved (uid:N, cn:NAME, insecure), so every process with that
// identity has the same rights; gid:N in a grant matches a unix-socket
// caller whose primary gid (SO_PEERCRED) is N.

// Identities is a list of identities (uid:N, gid:N, cn:NAME), as a flag
// (comma-separated, repeatable: each use adds) and in YAML (a sequence). A
// plain value.
type Identities []string

// String implements pflag.Value.
func (l Identities) String() string { return strings.Join(l, ",") }

// Type implements pflag.Value.
func (l *Identities) Type() string { return "identities" }

// Set implements pflag.Value: it adds the comma-separated identities.
func (l *Identities) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if err := validIdentity(f); err != nil {
			return err
		}
		*l = append(*l, f)
	}
	return nil
}

// validIdentity checks one identity of a grant or of the admin list.
func validIdentity(s string) error {
	kind, v, ok := strings.Cut(s, ":")
	switch {
	case !ok:
	case kind == "uid" || kind == "gid":
		if _, err := strconv.ParseUint(v, 10, 32); err == nil {
			return nil
		}
	case kind == "cn":
		if v != "" && len(s) <= MaxNameLen && !strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r == ',' || r == 0x7f }) {
			return nil
		}
	}
	return fmt.Errorf("%w: identity %q: use uid:N or gid:N (a local process's uid or primary gid) or cn:NAME (a client certificate's common name)", errs.ErrInvalid, s)
}

// defaultAdmins is root and the daemon's own uid: the uids a call without
// a session on the unix socket is an administrator's from.
func defaultAdmins() Identities {
	out := Identities{uidIdentity(0)}
	if uid := os.Getuid(); uid != 0 {
		out = append(out, uidIdentity(uint32(uid)))
	}
	return out
}

// isAdmin reports whether a call without a session from ident is an
// administrator's: ident is in Config.Admins (gid:N entries match the
// primary gid of a unix-socket caller), or the TCP control plane is
// plaintext (--insecure), where nothing is proved and so nothing can be
// withheld.
func (c *Config) isAdmin(ident string, gid uint32, local bool) bool {
	if ident == identityInsecure {
		return c.Insecure
	}
	return matches(c.Admins, ident, gid, local)
}

// matches reports whether a grant list names ident (or, for a local
// caller, its primary gid).
func matches(grants []string, ident string, gid uint32, local bool) bool {
	return slices.Contains(grants, ident) || local && slices.Contains(grants, "gid:"+strconv.FormatUint(uint64(gid), 10))
}

// validGrants checks an allocation's grants: identities, and only with a name.
func validGrants(req allocRequest) error {
	if len(req.Allow)+len(req.AllowFree) > 0 && req.Name == "" {
		return fmt.Errorf("%w: allow and allow-free grant access to a name; give the segment a name (alloc.WithName)", errs.ErrInvalid)
	}
	if n := len(req.Allow) + len(req.AllowFree); n > maxGrants {
		return fmt.Errorf("%w: %d grants; at most %d per segment (grant a gid:N to many uids at once)", errs.ErrLimit, n, maxGrants)
	}
	for _, id := range slices.Concat(req.Allow, req.AllowFree) {
		if err := validIdentity(id); err != nil {
			return err
		}
	}
	return nil
}

// maxGrants is the most identities one segment may grant.
const maxGrants = 64

// granted reports whether the caller's identity is the creator of a
// named record or one the creator granted (with the free right when free
// is set). An unnamed segment is its owner's client id's alone.
func (c caller) granted(r *record, free bool) bool {
	if c.ident == "" || r.Name == "" {
		return false
	}
	if r.Creator == c.ident || matches(r.AllowFree, c.ident, c.gid, c.local) {
		return true
	}
	return !free && matches(r.Allow, c.ident, c.gid, c.local)
}

// mayAttach reports whether the caller may attach the segment by name: an
// administrator, its owner or an attacher, its creator's identity, or an
// identity granted access.
func mayAttach(c caller, r *record) bool {
	return mayUse(c, r) || c.granted(r, false)
}

// mayFree reports whether the caller may free the segment: an
// administrator, its owner (the client id that allocated it), its
// creator's identity, or an identity granted the free right. Attaching
// does not give the right to free.
func mayFree(c caller, r *record) bool {
	return c.client == nil || r.Owner == c.client.id || c.granted(r, true)
}

// mayList reports whether a listing or a Stat shows the segment to the
// caller: an administrator and a peer daemon's session see every
// segment (without keys unless they may use it); anyone else sees what it
// may attach.
func mayList(c caller, r *record) bool {
	return c.client == nil || strings.HasPrefix(c.id(), peerClientPrefix) || mayAttach(c, r)
}

// attachDenied explains a refused attach.
func attachDenied(c caller, r *record) error {
	by := r.Creator
	if by == "" {
		by = "an identity this daemon did not record (the segment predates grants)"
	}
	return fmt.Errorf("attach %q: %w: the segment was created by %s, which has not granted %s; the creator grants access with alloc.WithName(%q, alloc.AllowIdentity(%q)) or 'memctl alloc --name %s --allow %s'",
		r.Name, errs.ErrAccessDenied, by, c.ident, r.Name, c.ident, r.Name, c.ident)
}

// migrateGrants gives a record written before grants existed a creator
// and grants from what the daemon knows: the creator is the identity its
// owner's client id is bound to, and every identity bound to a client
// that had already attached it is granted attach; so sharing that worked
// before goes on, and nobody new gets in without a grant. It reports
// whether the record changed (to be committed once).
func (p *core) migrateGrants(r *record) bool {
	if r.Name == "" || r.Grants {
		return false
	}
	r.Grants = true
	r.Creator = p.auth.identity(r.Owner)
	for _, a := range r.Attached {
		if id := p.auth.identity(a); id != "" && id != r.Creator && !slices.Contains(r.Allow, id) {
			r.Allow = append(r.Allow, id)
		}
	}
	if r.Creator == "" {
		p.log.Warn("named segment from before grants has no known creator: only administrators and identities that attached it before may attach it; free it and allocate it again with grants to share it", "segment", r.ID, "name", r.Name, "allowed", r.Allow)
	}
	return true
}

// grant records the creator's identity and the request's grants.
func (r *record) grant(c caller, req allocRequest) {
	r.Creator, r.Allow, r.AllowFree, r.Grants = c.ident, req.Allow, req.AllowFree, true
}

// freeDenied explains a refused free.
func freeDenied(c caller, r *record) error {
	return fmt.Errorf("free segment %d: %w: only its owner, its creator's identity (%s) and identities granted the free right (alloc.AllowFree, 'memctl alloc --allow-free') may free it, not %s (attaching gives no right to free)",
		r.ID, errs.ErrAccessDenied, r.Creator, c.ident)
}

package cluster

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// Gossip keys. With Config.Keys set, memberlist encrypts and authenticates
// every gossip packet and stream with AES-GCM under the primary key and
// accepts those sealed with any key of the keyring; a packet that no key
// opens, a plaintext one included, is dropped before it is read, so a node
// without a key is never admitted and changes nothing. Several keys make
// rotation possible without downtime: install the new key everywhere, make
// it primary everywhere, then remove the old one.
//
// A key file holds the keys one per line, base64 (standard encoding, with
// padding) of 16, 24 or 32 bytes (AES-128, -192, -256); the first is the
// primary. Blank lines and lines starting with '#' are ignored:
//
//	# farmem gossip keyring: the first key is the primary
//	kF3hK9yq2dJ8b1n0mXl5rW7tV4cZ6sA2eG8iO1uP3Qs=
//	S1xGq0w2b0Jr5nD8fT6vY3aH9kM4pL7eR2uC5iN1oQk=

// KeySizes are the byte lengths a gossip key may have.
var KeySizes = []int{16, 24, 32}

// MaxKeys bounds the keys a keyring holds: rotation needs two.
const MaxKeys = 16

// maxKeyFile bounds a key file: MaxKeys lines of base64 with room for
// comments.
const maxKeyFile = 64 << 10

// CheckKey reports whether key has one of KeySizes, with an error naming
// the size and the sizes allowed.
func CheckKey(key []byte) error {
	if !slices.Contains(KeySizes, len(key)) {
		return fmt.Errorf("%w: gossip key of %d bytes; use 16, 24 or 32 bytes (AES-128, -192, -256), e.g. 'head -c 32 /dev/urandom | base64'", ErrBadKey, len(key))
	}
	return nil
}

// ParseKey decodes one key as a key file line writes it.
func ParseKey(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("%w: gossip key is not base64: %v", ErrBadKey, err)
	}
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	return key, nil
}

// ParseKeys reads a key file: the keys in order, the primary first, each
// once. An empty file, a line that is not a key, or more than MaxKeys keys
// is an error naming the line.
func ParseKeys(b []byte) ([][]byte, error) {
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("%w: key file of %d bytes, at most %d", ErrBadKey, len(b), maxKeyFile)
	}
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 256), maxKeyFile)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := ParseKey(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if slices.ContainsFunc(keys, func(k []byte) bool { return bytes.Equal(k, key) }) {
			continue
		}
		if len(keys) == MaxKeys {
			return nil, fmt.Errorf("%w: more than %d keys; remove old ones ('memctl keyring remove')", ErrBadKey, MaxKeys)
		}
		keys = append(keys, key)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadKey, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no key in the file; write one per line, base64 of 16, 24 or 32 bytes (memctl certs init writes gossip.key)", ErrBadKey)
	}
	return keys, nil
}

// FormatKeys writes keys as a key file, the primary first.
func FormatKeys(keys [][]byte) []byte {
	var b bytes.Buffer
	b.WriteString("# farmem gossip keyring: base64 keys, one a line, the first is the primary\n")
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Fingerprint names a key without revealing it: the first 8 bytes of its
// SHA-256, in hex.
func Fingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// Keys returns the keyring's keys, the primary first; nil when gossip is
// not encrypted.
func (c *Cluster) Keys() [][]byte {
	if c.kr == nil {
		return nil
	}
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	return slices.Clone(c.kr.GetKeys())
}

// InstallKey adds key to the keyring: gossip sealed with it is accepted
// from now on. Installing a key already there changes nothing.
func (c *Cluster) InstallKey(key []byte) error {
	if err := c.encrypted(); err != nil {
		return err
	}
	if err := CheckKey(key); err != nil {
		return err
	}
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	if len(c.kr.GetKeys()) >= MaxKeys && !c.hasKey(key) {
		return fmt.Errorf("%w: the keyring holds %d keys already; remove old ones first ('memctl keyring remove')", ErrBadKey, MaxKeys)
	}
	return c.kr.AddKey(key)
}

// UseKey makes an installed key the primary: this node seals its gossip
// with it from now on.
func (c *Cluster) UseKey(key []byte) error {
	if err := c.encrypted(); err != nil {
		return err
	}
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	if !c.hasKey(key) {
		return fmt.Errorf("%w: key %s is not installed on node %q; install it first ('memctl keyring install')", ErrBadKey, Fingerprint(key), c.name)
	}
	return c.kr.UseKey(key)
}

// RemoveKey drops a key that is not the primary; removing one that is
// not installed changes nothing.
func (c *Cluster) RemoveKey(key []byte) error {
	if err := c.encrypted(); err != nil {
		return err
	}
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	if bytes.Equal(c.kr.GetPrimaryKey(), key) {
		return fmt.Errorf("%w: key %s is the primary on node %q; make another key primary first ('memctl keyring use')", ErrBadKey, Fingerprint(key), c.name)
	}
	// memberlist's RemoveKey shifts the keys in place, in the array that
	// GetKeys handed to readers (its decryption included); UseKey first
	// gives the keyring a fresh array that no reader holds yet.
	if err := c.kr.UseKey(c.kr.GetPrimaryKey()); err != nil {
		return err
	}
	return c.kr.RemoveKey(key)
}

func (c *Cluster) encrypted() error {
	if c.kr == nil {
		return fmt.Errorf("%w: gossip is not encrypted on node %q; start poold with --gossip-key-file", ErrBadKey, c.name)
	}
	return nil
}

// hasKey reports whether key is installed. Caller holds c.keyMu.
func (c *Cluster) hasKey(key []byte) bool {
	return slices.ContainsFunc(c.kr.GetKeys(), func(k []byte) bool { return bytes.Equal(k, key) })
}

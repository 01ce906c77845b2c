package rdma

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Key is a random 128-bit access key that authorises one-sided operations on
// one exported segment, the analogue of an RDMA rkey (but unguessable).
// The zero Key is never issued. Key is a plain value, safe to copy and to use
// concurrently.
type Key [16]byte

// NewKey returns a fresh random key from crypto/rand.
func NewKey() (Key, error) {
	var k Key
	for {
		if _, err := rand.Read(k[:]); err != nil {
			return Key{}, fmt.Errorf("rdma: read random key: %w", err)
		}
		if !k.IsZero() {
			return k, nil
		}
	}
}

// IsZero reports whether k is the zero key, which no exporter ever issues.
func (k Key) IsZero() bool { return k == Key{} }

// String returns the key as 32 lowercase hex digits.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// ParseKey parses the 32 hex digits that Key.String returns.
func ParseKey(s string) (Key, error) {
	var k Key
	if len(s) != 2*len(k) {
		return Key{}, fmt.Errorf("rdma: parse key %q: want %d hex digits, got %d", s, 2*len(k), len(s))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return Key{}, fmt.Errorf("rdma: parse key %q: %w", s, err)
	}
	return k, nil
}

// MarshalText implements encoding.TextMarshaler (hex digits).
func (k Key) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (hex digits).
func (k *Key) UnmarshalText(b []byte) error {
	p, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = p
	return nil
}

// MoveToken is the token by which a move's old home tells the clients of
// a segment that its switch-over is done there (its last changed chunks
// reached the copy at the new home, whose id there is home and key key):
// it answers their operations MOVED carrying it (MovedError). A client
// told of the copy ahead of the switch-over goes there on that answer at
// once. The token is a hash of the copy's key and id, never zero: it
// names the copy without revealing anything of its key.
func MoveToken(key Key, home uint64) uint64 {
	h := sha256.New()
	h.Write([]byte("farmem move token\x00"))
	h.Write(key[:])
	h.Write(binary.LittleEndian.AppendUint64(nil, home))
	t := binary.LittleEndian.Uint64(h.Sum(nil))
	return max(t, 1)
}

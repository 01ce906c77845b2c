package alloc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/farmem/farmem/internal/certs"
)

// LoadTLS reads the PEM files of a client certificate, its key and the CA
// (as 'memctl certs init' makes them: DIR/NAME.crt, DIR/NAME.key,
// DIR/ca.crt) into a configuration for WithTLS. The certificate's common
// name is the identity poold sees, owning the client's segments and
// counted against its quotas.
func LoadTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	return certs.Files{Cert: certFile, Key: keyFile, CA: caFile}.Client()
}

// tlsAdvice says, per TLS problem, which Dial option to change.
var tlsAdvice = map[certs.Problem]string{
	certs.ServerWantsTLS:   "dial with alloc.WithTLS(cfg), cfg from alloc.LoadTLS(cert, key, ca) of a client certificate of poold's CA ('memctl certs init --dir DIR --clients NAME' makes one)",
	certs.ServerNotTLS:     "dial without alloc.WithTLS",
	certs.ServerUnverified: "LoadTLS's CA must be the one that signed poold's --tls-cert, and the target's host a name or IP that certificate is valid for",
	certs.ClientRefused:    "LoadTLS's certificate must be signed by the CA poold's --tls-ca names ('memctl certs init --dir DIR --clients NAME' with that CA's directory makes one)",
}

// dialError explains a failed Dial: over TCP a TLS mismatch when there is
// one, else that no poold answers at addr. It wraps cause, so errors.Is
// keeps matching what the session reported (ErrUnavailable, ctx errors).
func dialError(ctx context.Context, network, addr string, cfg *tls.Config, cause error) error {
	if network == "tcp" {
		var m *certs.Mismatch
		if err := certs.Diagnose(context.WithoutCancel(ctx), addr, cfg); errors.As(err, &m) {
			return fmt.Errorf("%w; %s: %w", m, tlsAdvice[m.Problem], cause)
		}
		return fmt.Errorf("no poold answers at tcp://%s (is it the address of its --listen?): %w", addr, cause)
	}
	return fmt.Errorf("no poold answers at %s (start one with 'poold', or point FARMEM_SOCKET at its socket): %w", addr, cause)
}

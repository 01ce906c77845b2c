package alloc

import (
	"crypto/tls"

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

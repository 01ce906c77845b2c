package certs

import "errors"

// ErrInvalid marks options Init cannot use (an empty or repeated name, a
// name that is not a file name, an address that is not an IP).
var ErrInvalid = errors.New("certs: invalid option")

// ErrLoad marks certificate files that cannot be read or do not fit
// together (a key that is not the certificate's, a CA file without a
// certificate). The message names the file.
var ErrLoad = errors.New("certs: cannot load TLS files")

// ErrWrongName marks a peer whose certificate does not name the node it
// was dialed as.
var ErrWrongName = errors.New("certs: the certificate names another node")

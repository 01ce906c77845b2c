// Package size parses and prints byte sizes the way people write them
// ("64MiB", "1G", "4096"). Size implements flag.Value, pflag.Value and
// encoding.TextUnmarshaler, so flags and YAML files share one syntax.
//
// Values are immutable; everything here is safe for concurrent use.
package size

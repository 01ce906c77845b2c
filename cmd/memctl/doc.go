// Command memctl is farmem's admin CLI: it shows a poold's status, tiers
// and segments, and allocates and frees segments. Every command that prints
// data takes -o json.
package main

// Command memctl is farmem's admin CLI: it shows a poold's status, tiers
// and segments, and allocates and frees segments; top watches tiers, clients
// and operation rates live; keyring lists and rotates the gossip keys of
// every node; completion writes shell completion scripts.
// Every command that prints data takes -o json.
package main

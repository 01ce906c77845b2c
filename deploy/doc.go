// Package deploy holds no code: it is the home of poold's deployment files,
// and its tests keep them honest.
//
//   - poold.yaml: an annotated example of every configuration key; the tests
//     fail when pool.Config gains a key the example does not show, or when
//     the example stops parsing and validating.
//   - systemd/poold.service: the systemd unit, and the drop-in
//     systemd/poold.service.d/rdma.conf for a verbs build (both checked
//     with systemd-analyze verify in CI where systemd-analyze exists).
//   - kubernetes/poold-daemonset.yaml: Namespace, ServiceAccount, ConfigMap,
//     headless Service and DaemonSet; the tests check the fields Kubernetes
//     requires and that the pieces agree (selector and labels, volumes and
//     mounts, probes and the metrics port, the ConfigMap's configuration).
//   - Dockerfile: the images the DaemonSet runs: static (the default
//     target, no cgo) and verbs (cgo, -tags verbs, libibverbs).
//
// The tests need no cluster, no systemd and no network; they run anywhere.
package deploy

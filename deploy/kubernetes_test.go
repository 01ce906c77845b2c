package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/farmem/farmem/pool"
)

// The subset of the Kubernetes API the manifest uses, with the names the
// API gives its fields. Decoding is strict (KnownFields), so a misspelt
// field in the manifest fails the test instead of being ignored, as the API
// server would do with strict field validation.

type object struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
}

type objectMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type configMap struct {
	object                       `yaml:",inline"`
	Data                         map[string]string `yaml:"data"`
	AutomountServiceAccountToken *bool             `yaml:"automountServiceAccountToken"` // ServiceAccount only
}

type service struct {
	object `yaml:",inline"`
	Spec   struct {
		ClusterIP                string            `yaml:"clusterIP"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		Selector                 map[string]string `yaml:"selector"`
		Ports                    []struct {
			Name     string `yaml:"name"`
			Port     int    `yaml:"port"`
			Protocol string `yaml:"protocol"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type daemonSet struct {
	object `yaml:",inline"`
	Spec   struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		UpdateStrategy yaml.Node `yaml:"updateStrategy"`
		Template       struct {
			Metadata objectMeta `yaml:"metadata"`
			Spec     podSpec    `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type podSpec struct {
	ServiceAccountName            string      `yaml:"serviceAccountName"`
	AutomountServiceAccountToken  *bool       `yaml:"automountServiceAccountToken"`
	HostNetwork                   bool        `yaml:"hostNetwork"`
	DNSPolicy                     string      `yaml:"dnsPolicy"`
	TerminationGracePeriodSeconds int         `yaml:"terminationGracePeriodSeconds"`
	PriorityClassName             string      `yaml:"priorityClassName"`
	Tolerations                   []yaml.Node `yaml:"tolerations"`
	Containers                    []container `yaml:"containers"`
	Volumes                       []volume    `yaml:"volumes"`
}

type container struct {
	Name            string   `yaml:"name"`
	Image           string   `yaml:"image"`
	ImagePullPolicy string   `yaml:"imagePullPolicy"`
	Args            []string `yaml:"args"`
	Env             []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom struct {
			FieldRef struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
		Protocol      string `yaml:"protocol"`
	} `yaml:"ports"`
	LivenessProbe   *probe    `yaml:"livenessProbe"`
	ReadinessProbe  *probe    `yaml:"readinessProbe"`
	Resources       yaml.Node `yaml:"resources"`
	SecurityContext struct {
		RunAsUser                *int64 `yaml:"runAsUser"`
		Privileged               *bool  `yaml:"privileged"`
		AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool   `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
			Add  []string `yaml:"add"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a named container port
	} `yaml:"httpGet"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	FailureThreshold    int `yaml:"failureThreshold"`
}

type volume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	HostPath *struct {
		Path string `yaml:"path"`
		Type string `yaml:"type"`
	} `yaml:"hostPath"`
	EmptyDir *struct {
		Medium string `yaml:"medium"`
	} `yaml:"emptyDir"`
	Secret *struct {
		SecretName  string `yaml:"secretName"`
		DefaultMode int    `yaml:"defaultMode"`
	} `yaml:"secret"`
}

// manifest is the parsed multi-document file.
type manifest struct {
	docs       []object
	configMaps map[string]configMap
	services   []service
	daemonSets []daemonSet
}

func decodeStrict(n *yaml.Node, v any) error {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(n); err != nil {
		return err
	}
	dec := yaml.NewDecoder(&buf)
	dec.KnownFields(true)
	return dec.Decode(v)
}

func parseManifest(src []byte) (*manifest, error) {
	m := &manifest{configMaps: map[string]configMap{}}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	for i := 0; ; i++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var o object
		if err := n.Decode(&o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		m.docs = append(m.docs, o)
		var err2 error
		switch o.Kind {
		case "ConfigMap", "ServiceAccount", "Namespace":
			var c configMap
			err2 = decodeStrict(&n, &c)
			if o.Kind == "ConfigMap" {
				m.configMaps[o.Metadata.Name] = c
			}
		case "Service":
			var s service
			err2 = decodeStrict(&n, &s)
			m.services = append(m.services, s)
		case "DaemonSet":
			var d daemonSet
			err2 = decodeStrict(&n, &d)
			m.daemonSets = append(m.daemonSets, d)
		default:
			err2 = fmt.Errorf("kind %q is not one this test knows; teach it", o.Kind)
		}
		if err2 != nil {
			return nil, fmt.Errorf("document %d (%s %s): %w", i, o.Kind, o.Metadata.Name, err2)
		}
	}
	return m, nil
}

const manifestPath = "kubernetes/poold-daemonset.yaml"

func loadManifest(t *testing.T) *manifest {
	t.Helper()
	src, err := os.ReadFile(manifestPath)
	require.NoError(t, err)
	m, err := parseManifest(src)
	require.NoError(t, err)
	return m
}

func TestManifestObjects(t *testing.T) {
	m := loadManifest(t)
	apiVersions := map[string]string{"Namespace": "v1", "ServiceAccount": "v1", "ConfigMap": "v1", "Service": "v1", "DaemonSet": "apps/v1"}
	kinds := map[string]int{}
	for i, o := range m.docs {
		t.Run(fmt.Sprintf("%d-%s", i, o.Kind), func(t *testing.T) {
			require.NotEmpty(t, o.Kind, "kind")
			require.Equal(t, apiVersions[o.Kind], o.APIVersion, "apiVersion of %s", o.Kind)
			require.NotEmpty(t, o.Metadata.Name, "metadata.name")
			require.LessOrEqual(t, len(o.Metadata.Name), 63)
			if o.Kind != "Namespace" {
				require.Equal(t, "farmem", o.Metadata.Namespace, "every namespaced object is in the farmem namespace")
			}
		})
		kinds[o.Kind]++
	}
	for k := range apiVersions {
		require.Equal(t, 1, kinds[k], "one %s", k)
	}
	require.Equal(t, "Namespace", m.docs[0].Kind, "the namespace comes first so that kubectl apply creates it before its objects")
}

func TestDaemonSet(t *testing.T) {
	m := loadManifest(t)
	require.Len(t, m.daemonSets, 1)
	ds := m.daemonSets[0]
	pod := ds.Spec.Template.Spec

	t.Run("selector matches the template's labels", func(t *testing.T) {
		require.NotEmpty(t, ds.Spec.Selector.MatchLabels)
		for k, v := range ds.Spec.Selector.MatchLabels {
			require.Equal(t, v, ds.Spec.Template.Metadata.Labels[k], "template label %s", k)
		}
		for _, s := range m.services {
			for k, v := range s.Spec.Selector {
				require.Equal(t, v, ds.Spec.Template.Metadata.Labels[k], "service %s selects label %s", s.Metadata.Name, k)
			}
		}
	})

	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	ports := map[string]int{}
	for _, p := range c.Ports {
		require.LessOrEqual(t, len(p.Name), 15, "port name %q: at most 15 characters", p.Name)
		require.NotContains(t, ports, p.Name, "port names are unique")
		ports[p.Name] = p.ContainerPort
	}

	t.Run("container", func(t *testing.T) {
		require.NotEmpty(t, c.Name)
		require.NotEmpty(t, c.Image, "image")
		require.Contains(t, c.Image, ":", "image has a tag")
		require.True(t, pod.HostNetwork, "gossip and the data plane listen on the node's address")
		require.Equal(t, "ClusterFirstWithHostNet", pod.DNSPolicy, "hostNetwork pods resolve the headless service only with ClusterFirstWithHostNet")
		require.NotNil(t, c.SecurityContext.Privileged)
		require.False(t, *c.SecurityContext.Privileged)
		require.Contains(t, c.SecurityContext.Capabilities.Drop, "ALL")
		require.Equal(t, pod.ServiceAccountName, "poold")
		for _, want := range []struct {
			name  string
			port  int
			proto string
		}{{"gossip-tcp", 7946, "TCP"}, {"gossip-udp", 7946, "UDP"}, {"grpc", 7950, "TCP"}, {"data", 7960, "TCP"}, {"metrics", 9464, "TCP"}} {
			require.Equal(t, want.port, ports[want.name], "port %s", want.name)
		}
	})

	t.Run("every mount has a volume", func(t *testing.T) {
		vols := map[string]volume{}
		for _, v := range pod.Volumes {
			_, dup := vols[v.Name]
			require.False(t, dup, "volume %s twice", v.Name)
			n := 0
			for _, set := range []bool{v.ConfigMap != nil, v.HostPath != nil, v.EmptyDir != nil, v.Secret != nil} {
				if set {
					n++
				}
			}
			require.Equal(t, 1, n, "volume %s has one source", v.Name)
			if v.ConfigMap != nil {
				require.Contains(t, m.configMaps, v.ConfigMap.Name, "volume %s names a ConfigMap in the manifest", v.Name)
			}
			vols[v.Name] = v
		}
		used := map[string]bool{}
		paths := map[string]bool{}
		for _, vm := range c.VolumeMounts {
			_, ok := vols[vm.Name]
			require.True(t, ok, "mount %s names volume %q, which the pod does not define", vm.MountPath, vm.Name)
			require.False(t, paths[vm.MountPath], "mount path %s twice", vm.MountPath)
			require.True(t, path.IsAbs(vm.MountPath))
			used[vm.Name], paths[vm.MountPath] = true, true
		}
		for name := range vols {
			require.True(t, used[name], "volume %s is mounted", name)
		}
	})

	t.Run("probes on the metrics port", func(t *testing.T) {
		for _, p := range []struct {
			name  string
			probe *probe
			path  string
		}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
			require.NotNil(t, p.probe, p.name)
			require.NotNil(t, p.probe.HTTPGet, p.name)
			require.Equal(t, p.path, p.probe.HTTPGet.Path, p.name)
			require.Equal(t, 9464, resolvePort(t, p.probe.HTTPGet.Port, ports), p.name)
		}
	})

	t.Run("scrape annotations", func(t *testing.T) {
		a := ds.Spec.Template.Metadata.Annotations
		require.Equal(t, "true", a["prometheus.io/scrape"])
		require.Equal(t, strconv.Itoa(ports["metrics"]), a["prometheus.io/port"])
		require.Equal(t, "/metrics", a["prometheus.io/path"])
	})

	t.Run("env from the downward API", func(t *testing.T) {
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
		require.Equal(t, "spec.nodeName", env["NODE_NAME"])
		require.Contains(t, c.Args, "--node=$(NODE_NAME)")
		for _, a := range c.Args {
			for _, ref := range refs(a) {
				require.Contains(t, env, ref, "argument %q uses $(%s), which the container's env does not define", a, ref)
			}
		}
	})
}

// resolvePort turns a probe's port (number or name) into a number.
func resolvePort(t *testing.T, p any, named map[string]int) int {
	t.Helper()
	switch v := p.(type) {
	case int:
		return v
	case string:
		n, ok := named[v]
		require.True(t, ok, "probe port %q is not a named container port", v)
		return n
	}
	t.Fatalf("probe port %v (%T) is neither a number nor a name", p, p)
	return 0
}

// refs returns the $(VAR) references Kubernetes expands in an argument.
func refs(s string) []string {
	var out []string
	for {
		i := strings.Index(s, "$(")
		if i < 0 {
			return out
		}
		j := strings.IndexByte(s[i:], ')')
		if j < 0 {
			return out
		}
		out = append(out, s[i+2:i+j])
		s = s[i+j+1:]
	}
}

// TestDaemonSetConfig checks that poold starts with what the DaemonSet gives
// it: the ConfigMap's file, overridden by the container's flags (whose
// names are the file's keys), and that the paths in it are the mounts.
func TestDaemonSetConfig(t *testing.T) {
	m := loadManifest(t)
	ds := m.daemonSets[0]
	c := ds.Spec.Template.Spec.Containers[0]
	mounts := map[string]string{} // mount path -> volume name
	for _, vm := range c.VolumeMounts {
		mounts[vm.MountPath] = vm.Name
	}
	hostPaths := map[string]string{} // volume name -> host path
	cmVolume := map[string]string{}  // volume name -> ConfigMap
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
		if v.ConfigMap != nil {
			cmVolume[v.Name] = v.ConfigMap.Name
		}
	}

	// The flags as a YAML overlay; $(VAR)s as the kubelet would expand them.
	expand := strings.NewReplacer("$(NODE_NAME)", "node-a", "$(NODE_IP)", "10.0.0.5")
	var overlay strings.Builder
	var configFile string
	keys := configKeys(t)
	for _, a := range c.Args {
		k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		require.True(t, ok && strings.HasPrefix(a, "--"), "argument %q: write flags as --key=value", a)
		if k == "config" {
			configFile = v
			continue
		}
		require.Contains(t, keys, k, "flag --%s is no poold setting", k)
		fmt.Fprintf(&overlay, "%s: %q\n", k, expand.Replace(v))
	}
	require.NotEmpty(t, configFile, "--config")
	cmName := cmVolume[mounts[path.Dir(configFile)]]
	require.NotEmpty(t, cmName, "--config %s is in a ConfigMap volume's mount", configFile)
	file, ok := m.configMaps[cmName].Data[path.Base(configFile)]
	require.True(t, ok, "ConfigMap %s has key %s", cmName, path.Base(configFile))

	cfg, err := pool.ParseConfig([]byte(file), pool.DefaultConfig())
	require.NoError(t, err, "the ConfigMap's %s", path.Base(configFile))
	cfg, err = pool.ParseConfig([]byte(overlay.String()), cfg)
	require.NoError(t, err, "the container's flags")
	require.NoError(t, cfg.Validate())
	require.Equal(t, "node-a", cfg.Node)

	_, port, err := net.SplitHostPort(cfg.Metrics)
	require.NoError(t, err, "metrics %q", cfg.Metrics)
	require.Equal(t, ds.Spec.Template.Metadata.Annotations["prometheus.io/port"], port, "metrics listens on the scraped port")
	host, _, _ := net.SplitHostPort(cfg.Metrics)
	require.Contains(t, []string{"0.0.0.0", "", "::"}, host, "the kubelet probes the node's address: metrics listens on every address")

	// Paths poold writes are mounted from the host, so they outlive the pod
	// and (the socket) are shared with the node's other pods.
	for _, p := range []struct{ what, dir, host string }{
		{"socket", path.Dir(cfg.Socket), "/run/farmem"},
		{"data-dir", cfg.DataDir, "/var/lib/farmem"},
		{"shm-dir", cfg.ShmDir, "/dev/shm/farmem"},
		{"sysfs-root", cfg.SysfsRoot, "/sys"},
		{"dev-root /dev", path.Join(cfg.DevRoot, "dev"), "/dev"},
	} {
		vol, ok := mounts[p.dir]
		require.True(t, ok, "%s: %s is a mount", p.what, p.dir)
		require.Equal(t, p.host, hostPaths[vol], "%s: volume %s", p.what, vol)
	}

	// Mutual TLS: the node's certificate, key and the CA come from the
	// node's own host directory, read-only, so a pod holds only its node's
	// key pair (a Secret with every node's keys would be in every pod).
	require.False(t, cfg.Insecure, "the control plane serves mutual TLS")
	readOnly := map[string]bool{}
	for _, vm := range c.VolumeMounts {
		readOnly[vm.MountPath] = vm.ReadOnly
	}
	for _, f := range []string{cfg.TLSCert, cfg.TLSKey, cfg.TLSCA} {
		require.NotEmpty(t, f)
		dir := path.Dir(f)
		require.Equal(t, "/etc/farmem/tls", hostPaths[mounts[dir]], "%s is in the host's /etc/farmem/tls", f)
		require.True(t, readOnly[dir], "%s is mounted read-only", dir)
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/etc/farmem/tls" {
			require.Equal(t, "Directory", v.HostPath.Type, "a node without its key pair does not start poold with an empty directory")
		}
		if v.Secret != nil {
			require.NotContains(t, v.Secret.SecretName, "tls", "no Secret carries the nodes' key pairs")
		}
	}
	require.Equal(t, "node-a.crt", path.Base(cfg.TLSCert), "each node presents its own certificate")
	require.Equal(t, "node-a.key", path.Base(cfg.TLSKey), "each node uses its own key")

	// Application pods need not run as root: the socket admits a gid.
	require.NotEmpty(t, cfg.AllowGIDs, "allow-gids lets non-root application pods use the socket")
	require.NotContains(t, cfg.AllowGIDs, uint32(0))

	// The gossip key, one for the whole cluster, comes from a Secret.
	gossipSecret := ""
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Name == mounts[path.Dir(cfg.GossipKeyFile)] {
			gossipSecret = v.Secret.SecretName
		}
	}
	require.False(t, cfg.GossipInsecure, "gossip is sealed")
	require.NotEmpty(t, gossipSecret, "the gossip key %q is in a Secret volume's mount", cfg.GossipKeyFile)

	// The gossip seed is the headless service, which publishes pods before
	// they are ready (a starting daemon must find the others).
	require.Len(t, m.services, 1)
	svc := m.services[0]
	require.Equal(t, "None", svc.Spec.ClusterIP)
	require.True(t, svc.Spec.PublishNotReadyAddresses)
	require.Equal(t, []string{fmt.Sprintf("%s.%s.svc.cluster.local:%d", svc.Metadata.Name, svc.Metadata.Namespace, 7946)}, cfg.Join)
	_, gport, err := net.SplitHostPort(cfg.Gossip)
	require.NoError(t, err)
	require.Equal(t, "7946", gport)
}

func TestParseManifestRejects(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "Pod"},
		{"misspelt field", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndatta: {}\n", "datta"},
		{"misspelt pod field", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec: {template: {spec: {hostNetwrk: true}}}\n", "hostNetwrk"},
		{"not yaml", "a: [\n", "document 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseManifest([]byte(tc.src))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

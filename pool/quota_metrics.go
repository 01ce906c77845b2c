package pool

import "github.com/prometheus/client_golang/prometheus"

// quotaCollector exports each identity's bytes per tier beside its quota
// (the rows of Status.quotas) as farmem_quota_used_bytes and
// farmem_quota_bytes. It reads the pool at scrape time; safe for
// concurrent use as the core is.
type quotaCollector struct {
	p           *core
	used, quota *prometheus.Desc
}

func newQuotaCollector(p *core) *quotaCollector {
	labels := []string{"identity", "tier"}
	return &quotaCollector{
		p:     p,
		used:  prometheus.NewDesc(metricsNamespace+"_quota_used_bytes", "Bytes an identity holds on a tier (identities with segments or a quota of their own).", labels, nil),
		quota: prometheus.NewDesc(metricsNamespace+"_quota_bytes", "An identity's quota on a tier (only where one is set).", labels, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.used
	ch <- c.quota
}

// Collect implements prometheus.Collector.
func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	for _, q := range c.p.quotaUsage() {
		tier := tierName(q.Tier)
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(q.UsedBytes), q.Identity, tier)
		if q.QuotaBytes > 0 {
			ch <- prometheus.MustNewConstMetric(c.quota, prometheus.GaugeValue, float64(q.QuotaBytes), q.Identity, tier)
		}
	}
}

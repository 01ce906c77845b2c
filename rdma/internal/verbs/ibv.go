//go:build linux && cgo && verbs

package verbs

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	int port;
	int gid_index;
	union ibv_gid gid;
	uint16_t lid;
	uint8_t mtu;
	uint8_t link_layer;
	int max_qp_rd_atom;
	int max_qp_init_rd_atom;
	int atomic_cap;
	char name[64];
} fm_dev;

static int fm_is_v4mapped(const uint8_t *g) {
	for (int k = 0; k < 10; k++) if (g[k]) return 0;
	return g[10] == 0xff && g[11] == 0xff;
}

// fm_pick_gid chooses the GID a RoCE port sends from: a RoCE v2 entry with an
// IPv4-mapped address (routable over UDP/IP like perftest's -x 1), else any
// RoCE v2 entry, else an IPv4-mapped one; InfiniBand ports use index 0.
static int fm_pick_gid(struct ibv_context *ctx, int port, int len, int link_layer) {
	if (link_layer != IBV_LINK_LAYER_ETHERNET) return 0;
	int any = -1;
	for (int i = 0; i < len; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(ctx, port, i, &e, 0)) continue;
		if (e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
		if (fm_is_v4mapped(e.gid.raw)) return i;
		if (any < 0) any = i;
	}
	if (any >= 0) return any;
	for (int i = 0; i < len; i++) {
		union ibv_gid g;
		if (ibv_query_gid(ctx, port, i, &g) == 0 && fm_is_v4mapped(g.raw)) return i;
	}
	return -1;
}

// fm_open opens the device named want ("" = the first with an active port)
// and allocates its protection domain. On failure it returns non-zero and
// says why in msg.
static int fm_open(fm_dev *d, const char *want, int gid_index, char *msg, int msglen) {
	int n = 0;
	msg[0] = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list) { snprintf(msg, msglen, "ibv_get_device_list: %s", strerror(errno)); return -1; }
	int found = 0;
	for (int i = 0; i < n && !found; i++) {
		const char *name = ibv_get_device_name(list[i]);
		if (want[0] && strcmp(name, want)) continue;
		struct ibv_context *ctx = ibv_open_device(list[i]);
		if (!ctx) { snprintf(msg, msglen, "ibv_open_device %s: %s", name, strerror(errno)); continue; }
		struct ibv_device_attr da;
		if (ibv_query_device(ctx, &da)) { snprintf(msg, msglen, "ibv_query_device %s: %s", name, strerror(errno)); ibv_close_device(ctx); continue; }
		for (int p = 1; p <= da.phys_port_cnt && !found; p++) {
			struct ibv_port_attr pa;
			if (ibv_query_port(ctx, p, &pa)) continue;
			if (pa.state != IBV_PORT_ACTIVE) {
				snprintf(msg, msglen, "%s port %d is %s, not active (is its network interface up?)", name, p, ibv_port_state_str(pa.state));
				continue;
			}
			int gi = gid_index >= 0 ? gid_index : fm_pick_gid(ctx, p, pa.gid_tbl_len, pa.link_layer);
			if (gi < 0 || ibv_query_gid(ctx, p, gi, &d->gid)) {
				snprintf(msg, msglen, "%s port %d has no usable GID (give its network interface an IP address, or set FARMEM_VERBS_GID_INDEX)", name, p);
				continue;
			}
			d->ctx = ctx; d->port = p; d->gid_index = gi; d->lid = pa.lid; d->mtu = pa.active_mtu;
			d->link_layer = pa.link_layer; d->max_qp_rd_atom = da.max_qp_rd_atom;
			d->max_qp_init_rd_atom = da.max_qp_init_rd_atom; d->atomic_cap = da.atomic_cap;
			snprintf(d->name, sizeof d->name, "%s", name);
			found = 1;
		}
		if (!found) ibv_close_device(ctx);
	}
	ibv_free_device_list(list);
	if (!found) {
		if (!msg[0]) {
			if (want[0]) snprintf(msg, msglen, "no RDMA device named %s", want);
			else snprintf(msg, msglen, "no RDMA device (for Soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IFACE)");
		}
		return -2;
	}
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		snprintf(msg, msglen, "ibv_alloc_pd on %s: %s", d->name, strerror(errno));
		ibv_close_device(d->ctx);
		return -3;
	}
	return 0;
}

static struct ibv_cq *fm_create_cq(fm_dev *d, int n) { return ibv_create_cq(d->ctx, n, NULL, NULL, 0); }

static struct ibv_qp *fm_create_qp(fm_dev *d, struct ibv_cq *cq, int depth) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = cq; a.recv_cq = cq; a.qp_type = IBV_QPT_RC; a.sq_sig_all = 0;
	a.cap.max_send_wr = depth; a.cap.max_recv_wr = 1; a.cap.max_send_sge = 1; a.cap.max_recv_sge = 1;
	return ibv_create_qp(d->pd, &a);
}

static uint32_t fm_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

// fm_connect moves qp through INIT, RTR and RTS towards the remote queue pair
// (qpn, psn, lid, gid); it returns 0, or 1/2/3 for the step that failed with
// errno in *err.
static int fm_connect(fm_dev *d, struct ibv_qp *qp, int access, uint32_t my_psn,
                      uint32_t qpn, uint32_t psn, uint16_t lid, uint8_t mtu, uint8_t grh, const uint8_t *gid, int *err) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT; a.pkey_index = 0; a.port_num = d->port; a.qp_access_flags = access;
	if ((*err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))) return 1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu < d->mtu ? mtu : d->mtu;
	a.dest_qp_num = qpn; a.rq_psn = psn;
	a.max_dest_rd_atomic = d->max_qp_rd_atom > 16 ? 16 : d->max_qp_rd_atom;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = lid; a.ah_attr.port_num = d->port;
	if (grh) {
		a.ah_attr.is_global = 1; a.ah_attr.grh.sgid_index = d->gid_index; a.ah_attr.grh.hop_limit = 64;
		memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
	}
	if ((*err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
	                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))) return 2;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.sq_psn = my_psn;
	a.max_rd_atomic = d->max_qp_init_rd_atom > 16 ? 16 : d->max_qp_init_rd_atom;
	if ((*err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
	                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))) return 3;
	return 0;
}

static struct ibv_mr *fm_reg(fm_dev *d, uintptr_t addr, size_t len, int access) {
	return ibv_reg_mr(d->pd, (void *)addr, len, access);
}
static uint32_t fm_mr_lkey(struct ibv_mr *mr) { return mr->lkey; }
static uint32_t fm_mr_rkey(struct ibv_mr *mr) { return mr->rkey; }

enum { FM_READ = 0, FM_WRITE = 1, FM_CAS = 2, FM_FADD = 3 };

typedef struct {
	uint64_t wr_id, laddr, raddr, compare_add, swap;
	uint32_t len, lkey, rkey, opcode, signaled, pad;
} fm_op;

// The data-path functions take their pointers as uintptr_t: every one of
// them points to C memory (libibverbs objects, and the work-request and
// completion arrays a connection allocates with calloc), so cgo's per-call
// pointer checks, which a pointer-typed argument costs, would find nothing.

// fm_post posts n work requests as one linked list (one doorbell).
static int fm_post(uintptr_t qpp, uintptr_t opsp, int n) {
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	fm_op *ops = (fm_op *)opsp;
	struct ibv_send_wr wr[n];
	struct ibv_sge sge[n];
	memset(wr, 0, sizeof wr);
	for (int i = 0; i < n; i++) {
		fm_op *o = &ops[i];
		sge[i].addr = o->laddr; sge[i].length = o->len; sge[i].lkey = o->lkey;
		wr[i].wr_id = o->wr_id; wr[i].sg_list = &sge[i]; wr[i].num_sge = 1;
		wr[i].send_flags = o->signaled ? IBV_SEND_SIGNALED : 0;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		switch (o->opcode) {
		case FM_READ: case FM_WRITE:
			wr[i].opcode = o->opcode == FM_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
			wr[i].wr.rdma.remote_addr = o->raddr; wr[i].wr.rdma.rkey = o->rkey;
			break;
		default:
			wr[i].opcode = o->opcode == FM_CAS ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
			wr[i].wr.atomic.remote_addr = o->raddr; wr[i].wr.atomic.rkey = o->rkey;
			wr[i].wr.atomic.compare_add = o->compare_add; wr[i].wr.atomic.swap = o->swap;
		}
	}
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

typedef struct { uint64_t wr_id; uint32_t status, pad; } fm_wc;

static int fm_poll(uintptr_t cqp, uintptr_t outp, int n, int64_t spin_ns);

// fm_post_poll posts like fm_post, then polls like fm_poll: one crossing
// from Go for a lone operation. It returns the number of completions, or
// -1000 - errno when the post failed.
static int fm_post_poll(uintptr_t qp, uintptr_t cq, uintptr_t ops, int n, uintptr_t out, int max, int64_t spin_ns) {
	int rc = fm_post(qp, ops, n);
	if (rc) return -1000 - rc;
	return fm_poll(cq, out, max, spin_ns);
}

// fm_poll polls cq until it yields completions or spin_ns nanoseconds pass,
// so a waiting caller crosses from Go to C once per wait, not once per poll.
static int fm_poll(uintptr_t cqp, uintptr_t outp, int n, int64_t spin_ns) {
	struct ibv_cq *cq = (struct ibv_cq *)cqp;
	fm_wc *out = (fm_wc *)outp;
	struct ibv_wc wc[32];
	if (n > 32) n = 32;
	struct timespec t0, t;
	for (unsigned it = 1;; it++) {
		int k = ibv_poll_cq(cq, n, wc);
		if (k < 0) return k;
		if (k > 0) {
			for (int i = 0; i < k; i++) { out[i].wr_id = wc[i].wr_id; out[i].status = wc[i].status; }
			return k;
		}
		// The clock is read every 256 polls, and first after 256, so a
		// completion that comes within them costs no clock read: where
		// the clock source is not the TSC (a VM whose TSC is unstable;
		// the QEMU lab's guest runs on the HPET) every read is a system
		// call and an emulated device access.
		if (it % 256) continue;
		if (it == 256) { clock_gettime(CLOCK_MONOTONIC, &t0); continue; }
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000000000LL + (t.tv_nsec - t0.tv_nsec) >= spin_ns) return 0;
	}
}
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"github.com/farmem/farmem/rdma"
)

// Access flags.
const (
	accessLocalWrite   = C.IBV_ACCESS_LOCAL_WRITE
	accessRemoteAll    = C.IBV_ACCESS_LOCAL_WRITE | C.IBV_ACCESS_REMOTE_READ | C.IBV_ACCESS_REMOTE_WRITE | C.IBV_ACCESS_REMOTE_ATOMIC
	wcSuccess          = C.IBV_WC_SUCCESS
	wcRemAccessErr     = C.IBV_WC_REM_ACCESS_ERR
	wcRemInvReqErr     = C.IBV_WC_REM_INV_REQ_ERR
	wcWRFlushErr       = C.IBV_WC_WR_FLUSH_ERR
	opRead             = C.FM_READ
	opWrite            = C.FM_WRITE
	opCAS              = C.FM_CAS
	opFAdd             = C.FM_FADD
	atomicNone         = C.IBV_ATOMIC_NONE
	linkLayerInfiniBnd = C.IBV_LINK_LAYER_INFINIBAND
)

// device is the process's one open RDMA device and protection domain,
// shared by every Conn and Server (an rkey is only valid within its PD, and
// one PD per process is what verbs programs normally use).
type device struct {
	d    C.fm_dev
	name string
}

var (
	devMu  sync.Mutex
	devOne *device
)

// openDevice opens the device the environment asks for (FARMEM_VERBS_DEVICE,
// FARMEM_VERBS_GID_INDEX; FARMEM_VERBS=off disables verbs), or the first
// with an active port. Success is cached for the life of the process;
// failure is not, so a device that appears later is found.
func openDevice() (*device, error) {
	devMu.Lock()
	defer devMu.Unlock()
	if devOne != nil {
		return devOne, nil
	}
	if v := os.Getenv("FARMEM_VERBS"); v == "off" || v == "0" {
		return nil, &rdma.NotSupportedError{Feature: "verbs transport", Reason: "disabled by FARMEM_VERBS=" + v}
	}
	gid := -1
	if s := os.Getenv("FARMEM_VERBS_GID_INDEX"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("rdma/verbs: FARMEM_VERBS_GID_INDEX=%q is not a GID table index (0, 1, ...)", s)
		}
		gid = n
	}
	want := C.CString(os.Getenv("FARMEM_VERBS_DEVICE"))
	defer C.free(unsafe.Pointer(want))
	var msg [256]C.char
	d := &device{}
	if rc := C.fm_open(&d.d, want, C.int(gid), &msg[0], C.int(len(msg))); rc != 0 {
		return nil, &rdma.NotSupportedError{Feature: "verbs transport", Reason: C.GoString(&msg[0])}
	}
	d.name = C.GoString(&d.d.name[0])
	if d.d.atomic_cap == atomicNone {
		C.ibv_dealloc_pd(d.d.pd)
		C.ibv_close_device(d.d.ctx)
		return nil, &rdma.NotSupportedError{Feature: "verbs transport", Reason: d.name + " does not support RDMA atomics, which compare-and-swap and fetch-and-add need"}
	}
	devOne = d
	return d, nil
}

// atomicScope maps the device's atomic_cap.
func (d *device) atomicScope() AtomicScope {
	switch d.d.atomic_cap {
	case C.IBV_ATOMIC_GLOB:
		return AtomicGlobal
	case C.IBV_ATOMIC_HCA:
		return AtomicHCA
	}
	return AtomicNone
}

// localInfo describes this side of a queue pair.
func (d *device) localInfo(qpn, psn uint32) qpInfo {
	q := qpInfo{QPN: qpn, PSN: psn, LID: uint16(d.d.lid), MTU: uint8(d.d.mtu), GRH: 1}
	if d.d.link_layer == linkLayerInfiniBnd {
		q.GRH = 0
	}
	copy(q.GID[:], C.GoBytes(unsafe.Pointer(&d.d.gid), 16))
	return q
}

// queuePair is one RC queue pair and its completion queue.
type queuePair struct {
	cq *C.struct_ibv_cq
	qp *C.struct_ibv_qp
}

func (d *device) newQueuePair(depth int) (*queuePair, error) {
	cq := C.fm_create_cq(&d.d, C.int(depth+1))
	if cq == nil {
		return nil, fmt.Errorf("rdma/verbs: ibv_create_cq on %s: out of resources (check ulimit -l)", d.name)
	}
	qp := C.fm_create_qp(&d.d, cq, C.int(depth))
	if qp == nil {
		C.ibv_destroy_cq(cq)
		return nil, fmt.Errorf("rdma/verbs: ibv_create_qp on %s: out of resources (check ulimit -l)", d.name)
	}
	return &queuePair{cq: cq, qp: qp}, nil
}

func (q *queuePair) num() uint32 { return uint32(C.fm_qp_num(q.qp)) }

// connect brings the queue pair to RTS towards the remote one.
func (d *device) connect(q *queuePair, access int, myPSN uint32, r qpInfo) error {
	var e C.int
	step := C.fm_connect(&d.d, q.qp, C.int(access), C.uint32_t(myPSN), C.uint32_t(r.QPN), C.uint32_t(r.PSN),
		C.uint16_t(r.LID), C.uint8_t(r.MTU), C.uint8_t(r.GRH), (*C.uint8_t)(unsafe.Pointer(&r.GID[0])), &e)
	if step != 0 {
		return fmt.Errorf("rdma/verbs: move queue pair %d to %s on %s: %w", q.num(), [4]string{"", "INIT", "RTR", "RTS"}[step], d.name, syscall.Errno(e))
	}
	return nil
}

func (q *queuePair) destroy() {
	C.ibv_destroy_qp(q.qp)
	C.ibv_destroy_cq(q.cq)
}

// memRegion is registered memory.
type memRegion struct {
	mr         *C.struct_ibv_mr
	lkey, rkey uint32
}

// register registers mapped (never Go heap) memory for access.
func (d *device) register(mem []byte, access int) (*memRegion, error) {
	mr := C.fm_reg(&d.d, C.uintptr_t(uintptr(unsafe.Pointer(unsafe.SliceData(mem)))), C.size_t(len(mem)), C.int(access))
	if mr == nil {
		return nil, fmt.Errorf("rdma/verbs: ibv_reg_mr of %d bytes on %s failed (memlock limit? run with ulimit -l unlimited or CAP_IPC_LOCK)", len(mem), d.name)
	}
	return &memRegion{mr: mr, lkey: uint32(C.fm_mr_lkey(mr)), rkey: uint32(C.fm_mr_rkey(mr))}, nil
}

func (m *memRegion) deregister() error {
	if rc := C.ibv_dereg_mr(m.mr); rc != 0 {
		return fmt.Errorf("rdma/verbs: ibv_dereg_mr: %w", syscall.Errno(rc))
	}
	return nil
}

// wr is one work request, laid out as the C side's fm_op.
type wr = C.fm_op

func newWR(id uint64, op int, laddr uintptr, n int, lkey uint32, raddr uint64, rkey uint32) wr {
	return wr{wr_id: C.uint64_t(id), opcode: C.uint32_t(op), laddr: C.uint64_t(laddr), len: C.uint32_t(n),
		lkey: C.uint32_t(lkey), raddr: C.uint64_t(raddr), rkey: C.uint32_t(rkey)}
}

func setAtomic(w *wr, compareAdd, swap uint64) {
	w.compare_add, w.swap = C.uint64_t(compareAdd), C.uint64_t(swap)
}

func setSignaled(w *wr) { w.signaled = 1 }

func wcID(c *completion) (uint64, uint32) { return uint64(c.wr_id), uint32(c.status) }

// post posts the work requests as one list. ws is in C memory (cmem).
func (q *queuePair) post(ws []wr) error {
	if rc := C.fm_post(q.qpAddr(), cAddr(unsafe.Pointer(&ws[0])), C.int(len(ws))); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// postPoll posts the work requests and polls for up to spinNs. ws and out
// are in C memory (cmem).
func (q *queuePair) postPoll(ws []wr, out []completion, spinNs int64) (int, error) {
	n := int(C.fm_post_poll(q.qpAddr(), q.cqAddr(), cAddr(unsafe.Pointer(&ws[0])), C.int(len(ws)),
		cAddr(unsafe.Pointer(&out[0])), C.int(len(out)), C.int64_t(spinNs)))
	switch {
	case n <= -1000:
		return 0, syscall.Errno(-1000 - n)
	case n < 0:
		return 0, fmt.Errorf("rdma/verbs: ibv_poll_cq failed (%d)", n)
	}
	return n, nil
}

// completion is one polled work completion.
type completion = C.fm_wc

// poll waits up to spinNs for completions and returns how many it stored
// in out, which is in C memory (cmem).
func (q *queuePair) poll(out []completion, spinNs int64) (int, error) {
	n := C.fm_poll(q.cqAddr(), cAddr(unsafe.Pointer(&out[0])), C.int(len(out)), C.int64_t(spinNs))
	if n < 0 {
		return 0, fmt.Errorf("rdma/verbs: ibv_poll_cq failed (%d)", int(n))
	}
	return int(n), nil
}

func (q *queuePair) qpAddr() C.uintptr_t { return cAddr(unsafe.Pointer(q.qp)) }
func (q *queuePair) cqAddr() C.uintptr_t { return cAddr(unsafe.Pointer(q.cq)) }

// cAddr passes a pointer to C memory as an integer, which cgo does not
// check (see the C functions above).
func cAddr(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }

// cmem is memory from C's allocator for the arrays the data path hands to
// C: work requests and completions hold no Go pointers, and in C memory
// they need no cgo pointer checks.
type cmem struct{ p unsafe.Pointer }

// newCmem allocates zeroed C memory for wrs work requests and wcs
// completions.
func newCmem(wrs, wcs int) (cmem, []wr, []completion, error) {
	wsz, csz := int(unsafe.Sizeof(wr{})), int(unsafe.Sizeof(completion{}))
	p := C.calloc(C.size_t(wrs*wsz+wcs*csz), 1)
	if p == nil {
		return cmem{}, nil, nil, fmt.Errorf("rdma/verbs: allocate %d work requests: out of memory", wrs)
	}
	ws := unsafe.Slice((*wr)(p), wrs)
	cs := unsafe.Slice((*completion)(unsafe.Add(p, wrs*wsz)), wcs)
	return cmem{p}, ws, cs, nil
}

func (m cmem) free() { C.free(m.p) }

func wcStatusString(st uint32) string {
	return C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(st)))
}

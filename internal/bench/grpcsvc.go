package bench

import (
	"context"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// GRPC is a plain gRPC unary read/write service on 127.0.0.1 (in this
// process, or another one started with Serve), as a team would write one
// in an afternoon: Read takes a UInt64Value (key<<32 | size) and returns a
// BytesValue; Write takes a BytesValue whose first byte names the key and
// returns Empty. One client connection (HTTP/2 multiplexes the in-flight
// calls), default options. Safe for concurrent use.
type GRPC struct {
	srv *grpcServer // nil when the server is another process
	cc  *grpc.ClientConn
	pid int
}

var _ System = (*GRPC)(nil)

const (
	grpcRead  = "/farmem.bench.v1.Memory/Read"
	grpcWrite = "/farmem.bench.v1.Memory/Write"
)

// memoryServer is the service's handler type, for grpc's registration check.
type memoryServer interface {
	read(context.Context, *wrapperspb.UInt64Value) (*wrapperspb.BytesValue, error)
	write(context.Context, *wrapperspb.BytesValue) (*emptypb.Empty, error)
}

var grpcDesc = grpc.ServiceDesc{
	ServiceName: "farmem.bench.v1.Memory",
	HandlerType: (*memoryServer)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Read", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.UInt64Value)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(memoryServer).read(ctx, in)
		}},
		{MethodName: "Write", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(memoryServer).write(ctx, in)
		}},
	},
}

// grpcServer is the service.
type grpcServer struct {
	l   net.Listener
	srv *grpc.Server
	mu  sync.RWMutex
	mem map[int][]byte // Keys values per size, made on first use
}

func startGRPCServer() (*grpcServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("grpc: listen on 127.0.0.1: %w", err)
	}
	s := &grpcServer{l: l, srv: grpc.NewServer(), mem: map[int][]byte{}}
	s.srv.RegisterService(&grpcDesc, s)
	go s.srv.Serve(l)
	return s, nil
}

func (s *grpcServer) addr() string { return s.l.Addr().String() }

func (s *grpcServer) close() error { s.srv.Stop(); return nil }

func (s *grpcServer) slot(key, size int) ([]byte, error) {
	if key < 0 || key >= Keys || size <= 0 || size > 16<<20 {
		return nil, fmt.Errorf("%w: no value %d of %d B", ErrInvalid, key, size)
	}
	s.mu.RLock()
	mem := s.mem[size]
	s.mu.RUnlock()
	if mem == nil {
		s.mu.Lock()
		if mem = s.mem[size]; mem == nil {
			mem = make([]byte, Keys*size)
			s.mem[size] = mem
		}
		s.mu.Unlock()
	}
	return mem[key*size : key*size+size], nil
}

func (s *grpcServer) read(_ context.Context, in *wrapperspb.UInt64Value) (*wrapperspb.BytesValue, error) {
	v, err := s.slot(int(in.Value>>32), int(uint32(in.Value)))
	if err != nil {
		return nil, err
	}
	return &wrapperspb.BytesValue{Value: v}, nil
}

func (s *grpcServer) write(_ context.Context, in *wrapperspb.BytesValue) (*emptypb.Empty, error) {
	if len(in.Value) == 0 {
		return nil, fmt.Errorf("%w: empty write", ErrInvalid)
	}
	v, err := s.slot(int(in.Value[0]), len(in.Value))
	if err != nil {
		return nil, err
	}
	copy(v, in.Value)
	return &emptypb.Empty{}, nil
}

// NewGRPC starts the service in this process and dials it.
func NewGRPC() (*GRPC, error) {
	srv, err := startGRPCServer()
	if err != nil {
		return nil, err
	}
	g, err := DialGRPC(srv.addr(), 0)
	if err != nil {
		srv.close()
		return nil, err
	}
	g.srv = srv
	return g, nil
}

// DialGRPC connects to the service at addr (see Serve), run by process
// pid (0: unknown).
func DialGRPC(addr string, pid int) (*GRPC, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("grpc: dial %s: %w", addr, err)
	}
	return &GRPC{cc: cc, pid: pid}, nil
}

// Name is "grpc".
func (g *GRPC) Name() string { return "grpc" }

// Prepare checks the op; the server makes values on first use.
func (g *GRPC) Prepare(_ context.Context, op Op, _ int) error {
	if op == Atomic {
		return fmt.Errorf("the gRPC service has no atomics: %w", ErrNotSupported)
	}
	return nil
}

// Do makes one unary call.
func (g *GRPC) Do(ctx context.Context, op Op, key int, buf []byte) error {
	switch op {
	case Read:
		out := new(wrapperspb.BytesValue)
		if err := g.cc.Invoke(ctx, grpcRead, wrapperspb.UInt64(uint64(key)<<32|uint64(len(buf))), out); err != nil {
			return err
		}
		copy(buf, out.Value)
		return nil
	case Write:
		buf[0] = byte(key)
		return g.cc.Invoke(ctx, grpcWrite, wrapperspb.Bytes(buf), new(emptypb.Empty))
	}
	return ErrNotSupported
}

// ServerPID is the server's process when it is another one, else 0.
func (g *GRPC) ServerPID() int { return g.pid }

// Close closes the client and stops an in-process server. Idempotent.
func (g *GRPC) Close() error {
	g.cc.Close()
	if g.srv != nil {
		return g.srv.close()
	}
	return nil
}

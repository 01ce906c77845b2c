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

// GRPC is a plain gRPC unary read/write service on 127.0.0.1 in this
// process, as a team would write one in an afternoon: Read takes a
// UInt64Value (key<<32 | size) and returns a BytesValue; Write takes a
// BytesValue whose first byte names the key and returns Empty. One client
// connection (HTTP/2 multiplexes the in-flight calls), default options.
// Safe for concurrent use.
type GRPC struct {
	l    net.Listener
	srv  *grpc.Server
	cc   *grpc.ClientConn
	mu   sync.RWMutex
	mem  map[int][]byte // Keys values per size
	once sync.Once
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

// NewGRPC starts the service and dials it.
func NewGRPC() (*GRPC, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("grpc: listen on 127.0.0.1: %w", err)
	}
	g := &GRPC{l: l, srv: grpc.NewServer(), mem: map[int][]byte{}}
	g.srv.RegisterService(&grpcDesc, g)
	go g.srv.Serve(l)
	g.cc, err = grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("grpc: dial %s: %w", l.Addr(), err)
	}
	return g, nil
}

func (g *GRPC) slot(key, size int) ([]byte, error) {
	g.mu.RLock()
	mem := g.mem[size]
	g.mu.RUnlock()
	if mem == nil || key < 0 || key >= Keys {
		return nil, fmt.Errorf("%w: no value %d of %d B", ErrInvalid, key, size)
	}
	return mem[key*size : key*size+size], nil
}

func (g *GRPC) read(_ context.Context, in *wrapperspb.UInt64Value) (*wrapperspb.BytesValue, error) {
	s, err := g.slot(int(in.Value>>32), int(uint32(in.Value)))
	if err != nil {
		return nil, err
	}
	return &wrapperspb.BytesValue{Value: s}, nil
}

func (g *GRPC) write(_ context.Context, in *wrapperspb.BytesValue) (*emptypb.Empty, error) {
	if len(in.Value) == 0 {
		return nil, fmt.Errorf("%w: empty write", ErrInvalid)
	}
	s, err := g.slot(int(in.Value[0]), len(in.Value))
	if err != nil {
		return nil, err
	}
	copy(s, in.Value)
	return &emptypb.Empty{}, nil
}

// Name is "grpc".
func (g *GRPC) Name() string { return "grpc" }

// Prepare allocates the Keys values of size bytes on the server side.
func (g *GRPC) Prepare(_ context.Context, op Op, size int) error {
	if op == Atomic {
		return fmt.Errorf("the gRPC service has no atomics: %w", ErrNotSupported)
	}
	g.mu.Lock()
	if g.mem[size] == nil {
		g.mem[size] = make([]byte, Keys*size)
	}
	g.mu.Unlock()
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

// ServerPID is 0: the server runs in this process.
func (g *GRPC) ServerPID() int { return 0 }

// Close stops the client and the server. Idempotent.
func (g *GRPC) Close() error {
	g.once.Do(func() {
		if g.cc != nil {
			g.cc.Close()
		}
		g.srv.Stop()
	})
	return nil
}

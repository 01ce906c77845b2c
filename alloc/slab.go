package alloc

import (
	"fmt"
	"reflect"
	"unsafe"
)

// Slab is a typed view of an Arena for a pointer-free type T: each object
// is one T, read and written whole, or reached in place through Pointer on
// load/store tiers. T may hold only booleans, numbers and arrays or structs
// of them: far memory is invisible to the garbage collector, so a pointer
// stored there would not keep its target alive.
//
// A Slab is safe for concurrent use, as its Arena is; concurrent Store and
// Load of the same object race as plain memory does.
type Slab[T any] struct {
	a    *Arena
	size int
}

// NewSlab returns a typed view of a. It refuses, with ErrInvalid, a T that
// contains pointers, strings, slices, maps, channels, functions or
// interfaces, a T of size zero, and a T larger than MaxObjectSize.
func NewSlab[T any](a *Arena) (*Slab[T], error) {
	t := reflect.TypeFor[T]()
	if err := pointerFree(t, t.String()); err != nil {
		return nil, err
	}
	size := int(t.Size())
	if size == 0 || size > MaxObjectSize {
		return nil, fmt.Errorf("%w: Slab of %s: size %d bytes; use a type of 1 to %d bytes", ErrInvalid, t, size, MaxObjectSize)
	}
	if a == nil {
		return nil, fmt.Errorf("%w: Slab of %s needs an Arena; get one from NewArena", ErrInvalid, t)
	}
	return &Slab[T]{a: a, size: size}, nil
}

// pointerFree walks t and reports the first part of it the garbage
// collector would have to see.
func pointerFree(t reflect.Type, path string) error {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return nil
	case reflect.Array:
		return pointerFree(t.Elem(), path+"[]")
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if err := pointerFree(f.Type, path+"."+f.Name); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: Slab type %s is a %s, which holds a pointer the garbage collector cannot see in far memory; store only numbers, booleans, arrays and structs of them (keep a Ref instead of a pointer)", ErrInvalid, path, t.Kind())
}

// bytesOf views v's memory; T is pointer-free, so this is only a copy source.
func bytesOf[T any](v *T, size int) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(v)), size) }

// New allocates an object and stores v in it.
func (s *Slab[T]) New(v T) (Ref, error) {
	r, err := s.a.Alloc(s.size)
	if err != nil {
		return 0, err
	}
	if _, err := s.a.WriteAt(r, bytesOf(&v, s.size), 0); err != nil {
		return 0, fmt.Errorf("%w (and freeing the new object: %w)", err, s.a.Free(r))
	}
	return r, nil
}

// Load returns a copy of the object.
func (s *Slab[T]) Load(r Ref) (T, error) {
	var v T
	if _, err := s.a.ReadAt(r, bytesOf(&v, s.size), 0); err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// Store overwrites the object with v.
func (s *Slab[T]) Store(r Ref, v T) error {
	_, err := s.a.WriteAt(r, bytesOf(&v, s.size), 0)
	return err
}

// Pointer returns the object in place on load/store tiers (ErrNotSupported
// on rdma). The pointer is valid until Free; the garbage collector ignores
// it, and it must not be kept past Free.
func (s *Slab[T]) Pointer(r Ref) (*T, error) {
	b, err := s.a.Bytes(r)
	if err != nil {
		return nil, err
	}
	if len(b) != s.size {
		return nil, fmt.Errorf("%w: %v is %d bytes, not a %d-byte %s", ErrBadRef, r, len(b), s.size, reflect.TypeFor[T]())
	}
	return (*T)(unsafe.Pointer(&b[0])), nil
}

// Free releases the object.
func (s *Slab[T]) Free(r Ref) error { return s.a.Free(r) }

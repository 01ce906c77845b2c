package redundancy

import (
	"errors"
	"strings"
	"testing"

	"github.com/farmem/farmem/internal/errs"
)

func TestParse(t *testing.T) {
	good := map[string]Spec{
		"":                    {},
		"none":                {},
		"replicas=1":          {}, // one copy: none
		"replicas=2":          {Replicas: 2},
		"Replicas=3,or-fewer": {Replicas: 3, Fallback: true},
		"ec=4+2":              {Data: 4, Parity: 2},
		"ec=8+2,or-fewer":     {Data: 8, Parity: 2, Fallback: true},
		"ec=63+1":             {Data: 63, Parity: 1},
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"replicas=0", "replicas=-1", "replicas=65", "replicas=x", "ec=0+2", "ec=4+0",
		"ec=4", "ec=40+25", "ec=a+b", "mirror", "none,or-fewer", "replicas=2,or-more"} {
		_, err := Parse(in)
		if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "64") {
			t.Errorf("Parse(%q) = %v; want ErrInvalid that states the limits", in, err)
		}
	}
}

func TestStringParses(t *testing.T) {
	for _, s := range []Spec{{}, {Replicas: 2}, {Replicas: 2, Fallback: true}, {Data: 4, Parity: 2}, {Data: 10, Parity: 4, Fallback: true}} {
		back, err := Parse(s.String())
		if err != nil || back != s {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", s.String(), back, err, s)
		}
	}
}

func TestValidate(t *testing.T) {
	bad := []Spec{{Replicas: -1}, {Replicas: 65}, {Replicas: 2, Data: 2, Parity: 1}, {Data: 0, Parity: 2}, {Data: 3, Parity: 0}, {Data: 60, Parity: 5}}
	for _, s := range bad {
		if err := s.Validate(); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%+v.Validate() = %v; want ErrInvalid", s, err)
		}
	}
	for _, c := range []struct {
		s               Spec
		homes, survives int
	}{{Spec{}, 1, 0}, {Spec{Replicas: 3}, 3, 2}, {Spec{Data: 4, Parity: 2}, 6, 2}} {
		if c.s.Validate() != nil || c.s.Homes() != c.homes || c.s.Survives() != c.survives {
			t.Errorf("%+v: homes %d survives %d; want %d %d", c.s, c.s.Homes(), c.s.Survives(), c.homes, c.survives)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"none", "replicas=2", "ec=4+2", "ec=4+2,or-fewer", "ec=+", "replicas="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("Parse(%q): %v does not match ErrInvalid", in, err)
			}
			return
		}
		if s.Validate() != nil {
			t.Fatalf("Parse(%q) = %+v, which Validate refuses", in, s)
		}
		if back, err := Parse(s.String()); err != nil || back != s {
			t.Fatalf("Parse(%q) = %+v; its String %q parses to %+v, %v", in, s, s.String(), back, err)
		}
	})
}

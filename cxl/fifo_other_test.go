//go:build !linux

package cxl

import "errors"

func mkfifo(string) error { return errors.New("FIFO test only runs on linux") }

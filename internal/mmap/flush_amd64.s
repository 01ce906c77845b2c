#include "textflag.h"

// func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func flushLines(p *byte, n uintptr, op int)
TEXT ·flushLines(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), AX
	MOVQ n+8(FP), CX
	MOVQ op+16(FP), DX
	LEAQ (AX)(CX*1), CX // end
	ANDQ $~63, AX       // first line
	CMPQ DX, $2
	JEQ  clwb
	CMPQ DX, $1
	JEQ  clflushopt

clflush:
	CLFLUSH (AX)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   clflush
	JMP  done

clflushopt:
	CLFLUSHOPT (AX)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   clflushopt
	JMP  done

clwb:
	CLWB (AX)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   clwb

done:
	SFENCE
	RET

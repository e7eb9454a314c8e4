package datapath

// The fuzzer is guided by the coverage of Go code alone, never the
// programs': each outcome of each program gets a basic block of its own
// (every function literal is one), so an input that makes a program reach
// a verdict, drop reason or forwarding counter it had not is new coverage,
// kept and mutated further.

func fzCover(o fzOutcome, reason int) {
	v := 0
	switch {
	case reason == fzConsumed:
		v = 3
	case o.verdict == actShot:
		v = 1
	case o.verdict == actRedirect:
		v = 2
	}
	fzVerdictEdges[o.prog][v]()
	if reason >= 0 {
		fzReasonEdges[o.prog][reason]()
	}
	for i, n := range o.fwd {
		if n != 0 && i < len(fzForwardEdges[o.prog]) {
			fzForwardEdges[o.prog][i]()
		}
	}
}

var fzVerdictEdges = [fzProgs][4]func(){
	{func() {}, func() {}, func() {}, func() {}},
	{func() {}, func() {}, func() {}, func() {}},
	{func() {}, func() {}, func() {}, func() {}},
	{func() {}, func() {}, func() {}, func() {}},
	{func() {}, func() {}, func() {}, func() {}},
}

var fzReasonEdges = [fzProgs][64]func(){
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
}

var fzForwardEdges = [fzProgs][32]func(){
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
	{
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
		func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {}, func() {},
	},
}

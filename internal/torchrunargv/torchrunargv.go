// Package torchrunargv reads a trainer's command line the way torchrun's own argument parser would (torch 2.6 to
// 2.14, torch/distributed/run.py): where torchrun is, which of its flags are given, and what it runs (a script, a
// module with -m, or a program with --no-python). Pure: the webhook decides the warm start from it (docs/warm-start.md).
package torchrunargv

import (
	"path"
	"slices"
	"strings"
)

// valued are torchrun's flags that take a value (the word after them, or after '='), by their dashed long name;
// every other flag of torchrun's is a switch. Short forms are in short. The job chart's checks read the same list
// (ValuedFlags, through internal/chartcontract).
var valued = []string{"nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
	"max-restarts", "monitor-interval", "start-method", "event-log-handler", "role", "log-dir", "redirects", "tee",
	"log-line-prefix-template", "local-ranks-filter", "duplicate-stdout-filters", "duplicate-stderr-filters",
	"node-rank", "master-addr", "master-port", "local-addr", "logs-specs", "numa-binding", "signals-to-handle",
	"shutdown-timeout", "print-completion"}

// short maps torchrun's one-letter flags to their long names.
var short = map[string]string{"m": "module", "r": "redirects", "t": "tee"}

// ValuedFlags are torchrun's flags that take a value, as a command line spells them without dashes: the dashed long
// names and the one-letter forms of those ("r", "t"), sorted.
func ValuedFlags() []string {
	out := slices.Clone(valued)
	for s, long := range short {
		if slices.Contains(valued, long) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// Launch is what a command line asks of torchrun.
type Launch struct {
	// Flags are torchrun's own flags given (before what it runs), by dashed long name ("start-method"), with their
	// values ("" for a switch).
	Flags map[string]string
	// Entry is what torchrun runs: a script's path, a module's name (Flags has "module") or a program
	// ("no-python"); "" when the command line ends before it.
	Entry string
}

// Find reads argv (a container's command followed by its args) for torchrun: `torchrun ...` (any directory) or
// `python -m torch.distributed.run ...`. Elements holding spaces (sh -c "...") are split into words, as the job
// chart's checks do; a shell's own syntax is not read. ok is false when no torchrun is found.
func Find(argv []string) (l Launch, ok bool) {
	var words []string
	for _, a := range argv {
		words = append(words, strings.Fields(a)...)
	}
	start := -1
	for i, w := range words {
		if path.Base(w) == "torchrun" || (i > 0 && words[i-1] == "-m" && (w == "torch.distributed.run" || w == "torch.distributed.launch")) {
			start = i + 1
			break
		}
	}
	if start < 0 {
		return Launch{}, false
	}
	l.Flags = map[string]string{}
	for i := start; i < len(words); i++ {
		w := words[i]
		if w == "--" || !strings.HasPrefix(w, "-") || w == "-" {
			if w == "--" {
				i++
			}
			if i < len(words) {
				l.Entry = words[i]
			}
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
		if !strings.HasPrefix(w, "--") && len(name) > 1 && short[name[:1]] != "" && !hasValue {
			// -r3, -t3: argparse's short option with its value attached.
			name, value, hasValue = name[:1], name[1:], true
		}
		if long, isShort := short[name]; isShort && !strings.HasPrefix(w, "--") {
			name = long
		}
		name = strings.ReplaceAll(name, "_", "-")
		if slices.Contains(valued, name) && !hasValue && i+1 < len(words) {
			i++
			value = words[i]
		}
		l.Flags[name] = value
	}
	return l, true
}

// Has says whether a torchrun flag is given, by its dashed long name.
func (l Launch) Has(flag string) bool {
	_, ok := l.Flags[flag]
	return ok
}

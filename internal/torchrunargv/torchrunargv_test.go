package torchrunargv

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFind(t *testing.T) {
	for _, tc := range []struct {
		name  string
		argv  []string
		ok    bool
		entry string
		flags map[string]string
	}{
		{"the chart's default", []string{"torchrun", "/etc/elastic-training-script/train.py", "--steps=5"}, true,
			"/etc/elastic-training-script/train.py", map[string]string{}},
		{"a path and flags with values", []string{"/opt/venv/bin/torchrun", "--nproc_per_node", "8", "--tee=3", "-r", "3", "train.py"}, true,
			"train.py", map[string]string{"nproc-per-node": "8", "tee": "3", "redirects": "3"}},
		{"a short flag's value attached", []string{"torchrun", "-r3", "-t", "1", "train.py"}, true, "train.py",
			map[string]string{"redirects": "3", "tee": "1"}},
		{"a module", []string{"torchrun", "-m", "mypkg.train", "--lr=1"}, true, "mypkg.train", map[string]string{"module": ""}},
		{"--module", []string{"torchrun", "--module", "mypkg.train"}, true, "mypkg.train", map[string]string{"module": ""}},
		{"no python", []string{"torchrun", "--no_python", "bash", "run.sh"}, true, "bash", map[string]string{"no-python": ""}},
		{"the user's start method", []string{"torchrun", "--start-method", "spawn", "train.py"}, true, "train.py",
			map[string]string{"start-method": "spawn"}},
		{"python -m torch.distributed.run", []string{"python3", "-m", "torch.distributed.run", "--run-path", "train.py"}, true,
			"train.py", map[string]string{"run-path": ""}},
		{"in sh -c", []string{"sh", "-c", "pip install -q x && torchrun --standalone train.py --epochs 3"}, true, "train.py",
			map[string]string{"standalone": ""}},
		{"after --", []string{"torchrun", "--", "-odd.py"}, true, "-odd.py", map[string]string{}},
		{"no entry", []string{"torchrun", "--nnodes", "2"}, true, "", map[string]string{"nnodes": "2"}},
		{"a flag's value missing", []string{"torchrun", "--nnodes"}, true, "", map[string]string{"nnodes": ""}},
		{"no torchrun", []string{"python3", "train.py"}, false, "", nil},
		{"a file named like it", []string{"python3", "torchrun.py"}, false, "", nil},
		{"nothing", nil, false, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, ok := Find(tc.argv)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.entry, l.Entry)
			assert.Equal(t, tc.flags, l.Flags)
		})
	}
}

// Any command line: no panic, and what is found lies in it.
func FuzzFind(f *testing.F) {
	for _, s := range []string{"torchrun train.py", "torchrun -m x", "python -m torch.distributed.run -r3 --tee 3 -- a.py", "torchrun --", "torchrun -", "-m"} {
		f.Add(s, "")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		l, ok := Find([]string{a, b})
		if !ok && (l.Entry != "" || l.Flags != nil) {
			t.Fatalf("no torchrun, yet %+v", l)
		}
		if l.Entry != "" && !strings.Contains(a+" "+b, l.Entry) {
			t.Fatalf("entry %q is not in %q %q", l.Entry, a, b)
		}
	})
}

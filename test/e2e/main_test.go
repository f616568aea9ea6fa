// Package e2e holds the test harness's own tests: they prove that the local cluster behaves like a real
// one in the ways the project's e2e tests rely on.
package e2e

import (
	"testing"

	"github.com/elastic-training/elastic-training/test/e2e/framework"
)

func TestMain(m *testing.M) { framework.Main(m) }

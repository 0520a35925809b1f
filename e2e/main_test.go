package e2e

import (
	"os"
	"testing"

	"cairn/internal/testutil/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

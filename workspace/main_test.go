package workspace

import (
	"testing"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyNoLeaks(m) }

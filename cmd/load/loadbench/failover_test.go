package loadbench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFailoverSynchronous runs make failover's synchronous run, short: two local clusters, two
// wsproxy processes, three clients, the primary stopped hard and the standby promoted twice
// with the standby held behind before each fault (the old primary rebuilt in between). It fails
// on an acknowledged write missing, a write stored twice, or an event stream's gap.
func TestFailoverSynchronous(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "wsproxy")
	build := exec.Command("go", "build", "-o", bin, "github.com/wsproxy/wsproxy/cmd/proxy")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	f := Failover{Wsproxy: bin, Synchronous: true, Clients: 3, Faults: 2, Between: 2 * time.Second, Lag: 500 * time.Millisecond}
	require.NoError(t, f.Run(context.Background()))
}

package loadbench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

// TestWritesShort runs make bench-writes in miniature: two writers, one round, every row, two
// wsproxy processes on a fresh schema. It fails when a row writes nothing or an acknowledged
// write's event does not reach the other replica's stream.
func TestWritesShort(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "wsproxy")
	build := exec.Command("go", "build", "-o", bin, "github.com/wsproxy/wsproxy/cmd/proxy")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	u := dbtest.SchemaURL(t)
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, `DO $$ BEGIN EXECUTE 'DROP SCHEMA IF EXISTS ' || current_schema() || '_writes_floor CASCADE'; END $$`)
	})
	w := Writes{Wsproxy: bin, DatabaseURL: u, Writers: []int{2}, Duration: 300 * time.Millisecond, Rounds: 1, Floor: true}
	require.NoError(t, w.Run(context.Background()))
}

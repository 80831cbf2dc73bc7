package db

import (
	"context"
	"io/fs"
	"time"
)

// MigrateFS is Migrate with the migrations of fsys, and a lock_timeout of 100 ms.
func MigrateFS(ctx context.Context, b TxBeginner, fsys fs.FS) error {
	return migrate(ctx, b, fsys, 100*time.Millisecond)
}

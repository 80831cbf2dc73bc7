package db

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Listen receives the notifications of channel on a connection of its own — LISTEN needs a
// session, which a transaction-pooling PgBouncer does not keep, so connString should reach
// Postgres directly — and calls notify with each payload, until ctx ends. It calls resync each
// time it begins to listen: what was notified before, at the start or while it reconnected
// after a failure (waits doubling up to 10 s), reached no one. connString may be the pool's own
// URL (DATABASE_LISTEN_URL defaults to DATABASE_URL): its pool_* parameters size the pool and
// are not sent to Postgres.
func Listen(ctx context.Context, connString, channel string, notify func(payload string), resync func(), log *slog.Logger) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, connString, channel, notify, func() {
			wait = 100 * time.Millisecond
			resync()
		})
		if ctx.Err() != nil {
			return
		}
		log.LogAttrs(ctx, slog.LevelWarn, "listening for workspace events failed; retrying", slog.Duration("wait", wait), slog.Any("err", err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

func listenOnce(ctx context.Context, connString, channel string, notify func(string), listening func()) error {
	pcfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return err
	}
	cfg := pcfg.ConnConfig
	cfg.DialFunc = dial
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	listening()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		notify(n.Payload)
	}
}

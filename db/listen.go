package db

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Listen receives the notifications of channel on a connection of its own — LISTEN needs a
// session, which a transaction-pooling PgBouncer does not keep, so connString should reach
// Postgres directly — and calls notify with each payload, until ctx ends. After a failure it
// connects again (waits doubling up to 10 s), and calls resync once it listens again: what was
// notified in between was lost.
func Listen(ctx context.Context, connString, channel string, notify func(payload string), resync func(), log *slog.Logger) {
	wait := 100 * time.Millisecond
	for first := true; ctx.Err() == nil; first = false {
		err := listenOnce(ctx, connString, channel, notify, func() {
			wait = 100 * time.Millisecond
			if !first {
				resync()
			}
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
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return err
	}
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

package db

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// AddUsage adds a batch of turns' usage to their threads' totals in one round trip: one
// ThreadUsageAdd per thread, pipelined in one implicit transaction that does not wait for the
// disk, each adding its thread's usage once per batch (its writer and number). The threads are
// updated in id order (usage is sorted in place), so two replicas adding usage of the same
// threads at once never deadlock.
func AddUsage(ctx context.Context, pool *pgxpool.Pool, usage []ThreadUsageAddParams) error {
	slices.SortFunc(usage, func(a, b ThreadUsageAddParams) int { return strings.Compare(a.ID, b.ID) })
	b := &pgx.Batch{}
	for _, u := range usage {
		b.Queue(threadUsageAdd, u.WriterID, u.Batch, u.PromptTokens, u.CachedPromptTokens, u.CompletionTokens, u.CacheWriteTokens, u.ID)
	}
	return pool.SendBatch(ctx, b).Close()
}

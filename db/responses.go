package db

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RecordResponseTurn runs ResponseTurnRecord and, when the turn's client has ids to record,
// ClientResponseRecord, in one round trip and one transaction.
func RecordResponseTurn(ctx context.Context, pool *pgxpool.Pool, turn ResponseTurnRecordParams, client ClientResponseRecordParams) error {
	b := &pgx.Batch{}
	b.Queue(responseTurnRecord, turn.ThreadID, turn.ResponseID, turn.Turn, turn.LastResponseID, turn.OwedCallIds, turn.UserText)
	if client.Client != "" && len(client.Ids) > 0 {
		b.Queue(clientResponseRecord, client.Client, client.Ids)
	}
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record response turn: %w", err)
	}
	return nil
}

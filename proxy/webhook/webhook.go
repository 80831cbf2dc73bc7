// Package webhook tells a reviewer that a proposal waits (PROPOSALS_WEBHOOK, docs/spec.md §19):
// one small JSON POST a proposal — its thread, its event id, the title it would write; never a
// key or a token — sent by one goroutine from a bounded queue. A turn never waits for it: a
// proposal that finds the queue full is dropped (and counted, and logged); a POST that fails or
// times out is not sent again.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wsproxy/wsproxy/workspace"
)

// QueueSize bounds the proposals waiting to be sent; Timeout bounds one POST.
const (
	QueueSize = 256
	Timeout   = 5 * time.Second
)

// Body is what one POST carries.
type Body struct {
	Event    string `json:"event"` // "proposal"
	Thread   string `json:"thread"`
	Proposal int64  `json:"proposal"`
	Title    string `json:"title"`
}

// Sender posts proposals to a URL.
type Sender struct {
	url    string
	client *http.Client
	log    *slog.Logger
	queue  chan workspace.ProposalNotice
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	// Sent, Failed and Dropped count the proposals posted (a 2xx answer), those whose POST
	// failed, and those the full queue dropped.
	Sent, Failed, Dropped atomic.Int64
}

// New starts a sender to url, which must be an absolute http or https URL.
func New(url string, log *slog.Logger) *Sender {
	ctx, stop := context.WithCancel(context.Background())
	s := &Sender{url: url, client: &http.Client{Timeout: Timeout}, log: log, queue: make(chan workspace.ProposalNotice, QueueSize),
		ctx: ctx, stop: stop}
	s.wg.Add(1)
	go s.run()
	return s
}

// Notify queues ps without waiting: what does not fit is dropped.
func (s *Sender) Notify(ps []workspace.ProposalNotice) {
	for _, p := range ps {
		select {
		case s.queue <- p:
		default:
			s.Dropped.Add(1)
			s.log.Warn("PROPOSALS_WEBHOOK: queue full, a proposal was not posted", slog.String("thread", p.Thread), slog.Int64("proposal", p.Proposal))
		}
	}
}

// Close stops the sender: a POST under way is cut, what is queued is not sent.
func (s *Sender) Close() {
	s.stop()
	s.wg.Wait()
}

func (s *Sender) run() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case p := <-s.queue:
			if err := s.post(p); err != nil {
				s.Failed.Add(1)
				if s.ctx.Err() == nil {
					s.log.Warn("PROPOSALS_WEBHOOK: a proposal was not posted", slog.String("thread", p.Thread), slog.Int64("proposal", p.Proposal), slog.Any("err", err))
				}
				continue
			}
			s.Sent.Add(1)
		}
	}
}

func (s *Sender) post(p workspace.ProposalNotice) error {
	b, err := json.Marshal(Body{Event: "proposal", Thread: p.Thread, Proposal: p.Proposal, Title: p.Title})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, s.url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "wsproxy-webhook")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the webhook answered %s", resp.Status)
	}
	return nil
}

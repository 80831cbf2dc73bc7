package workspace

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/db"
)

// MaxPendingProposals bounds the proposals that wait for the user in one workspace (docs/spec.md
// §17, §19): review mode's, and the locked_skips that kept what the agent asked for.
const MaxPendingProposals = 20

// ProposalBook is what a call that would make proposals knows of the workspace's, read under the
// thread's row lock for the call's candidates (Locked.ProposalBook): how many proposals wait,
// which candidates equal one that waits or one the user dismissed, and review mode's pending
// objective proposal, which a newer one replaces. A call's plan is made twice when it proposes:
// without the book (nil: every candidate is made, and the candidates are known), then with it.
type ProposalBook struct {
	pending   int
	known     map[string]int // by proposalKey: proposalWaits or proposalDismissed
	objective int64          // the pending objective proposal's event; 0 none
}

// What the book knows of a candidate.
const (
	proposalNew = iota
	proposalWaits
	proposalDismissed
)

// proposalKey names a proposal by its target and the fields it would write.
func proposalKey(target Target, proposed []byte) string {
	return target.Type + "\x00" + strconv.FormatInt(target.ID, 10) + "\x00" + string(proposed)
}

// IsProposal reports whether c is a proposal the user may apply or dismiss.
func (c Change) IsProposal() bool {
	return c.kind == Proposed || (c.kind == LockedSkip && c.proposed != nil)
}

// Key names c by its target and the fields it proposes, if any: two changes of one call with
// one key are the same change.
func (c Change) Key() string { return proposalKey(c.target, c.proposed) }

// Clone is a copy of b that admits as b would now, whatever b admits later (nil for nil).
func (b *ProposalBook) Clone() *ProposalBook {
	if b == nil {
		return nil
	}
	c := *b
	c.known = maps.Clone(b.known)
	return &c
}

// Answers is the proposal c answers (an apply, a dismissal, or an objective proposal that
// replaces a pending one: ProposalBook.Admit); 0 none.
func (c Change) Answers() int64 { return c.answers }

// Proposes reports whether changes hold a proposal.
func Proposes(changes []Change) bool {
	for _, c := range changes {
		if c.IsProposal() {
			return true
		}
	}
	return false
}

// ProposalBook reads the book for the proposals of changes, with the thread's row lock.
func (l *Locked) ProposalBook(ctx context.Context, changes []Change) (*ProposalBook, error) {
	w, q := l.w, l.tx.Conn()
	arg := db.EventProposalBookParams{ThreadID: w.threadID}
	var keys []string
	for _, c := range changes {
		if !c.IsProposal() {
			continue
		}
		arg.TargetTypes = append(arg.TargetTypes, c.target.Type)
		arg.TargetIds = append(arg.TargetIds, c.target.ID)
		arg.Proposals = append(arg.Proposals, string(c.proposed))
		keys = append(keys, proposalKey(c.target, c.proposed))
	}
	r, err := w.store.q.EventProposalBook(ctx, q, arg)
	if err != nil {
		return nil, fmt.Errorf("read proposals: %w", err)
	}
	if len(r.Known) != len(keys) {
		return nil, fmt.Errorf("read proposals: %d answers for %d proposals", len(r.Known), len(keys))
	}
	b := &ProposalBook{pending: int(r.Pending), known: make(map[string]int, len(keys)), objective: r.Objective}
	for i, k := range keys {
		if r.Known[i] != proposalNew {
			b.known[k] = int(r.Known[i])
		}
	}
	return b, nil
}

// Admit decides whether c, a proposal of review mode, is made: not when an equal one waits or
// was dismissed, nor past MaxPendingProposals (held says why, naming it as what); an objective
// proposal replaces the pending one (c answers it) and adds none to those waiting. A nil book
// admits every candidate.
func (b *ProposalBook) Admit(c *Change, held *HeldProposals, what string) bool {
	if b == nil {
		return true
	}
	key := proposalKey(c.target, c.proposed)
	switch b.known[key] {
	case proposalWaits:
		held.waiting = append(held.waiting, what)
		return false
	case proposalDismissed:
		held.dismissed = append(held.dismissed, what)
		return false
	}
	switch {
	case c.target.Type == TargetObjective && b.objective != 0:
		c.answers, b.objective = b.objective, 0
	case b.pending >= MaxPendingProposals:
		held.full = append(held.full, what)
		return false
	default:
		b.pending++
	}
	if b.known == nil { // a zero book: nothing waits yet
		b.known = map[string]int{}
	}
	b.known[key] = proposalWaits
	return true
}

// AdmitSkips keeps the proposal of each locked_skip of changes that the book admits; one it does
// not (an equal one waits or was dismissed, or MaxPendingProposals wait) is recorded without a
// proposal: the call is in the history, and nothing more waits for the user.
func (b *ProposalBook) AdmitSkips(changes []Change) {
	if b == nil {
		return
	}
	for i := range changes {
		if c := &changes[i]; c.kind == LockedSkip && c.proposed != nil && !b.Admit(c, &HeldProposals{}, "") {
			c.proposed = nil
		}
	}
}

// HeldProposals are the proposals of a call that were not made, by why, each named as the result
// names it.
type HeldProposals struct {
	dismissed, waiting, full []string
}

// Parts are the result's parts that say so.
func (h HeldProposals) Parts() []string {
	var parts []string
	if len(h.dismissed) > 0 {
		parts = append(parts, "dismissed by the user: "+strings.Join(h.dismissed, ", "))
	}
	if len(h.waiting) > 0 {
		parts = append(parts, "already proposed, for the user to review: "+strings.Join(h.waiting, ", "))
	}
	if len(h.full) > 0 {
		parts = append(parts, fmt.Sprintf("not proposed: %d proposals already wait for the user's review: ", MaxPendingProposals)+
			strings.Join(h.full, ", "))
	}
	return parts
}

// Full reports whether a proposal was not made since MaxPendingProposals wait already.
func (h HeldProposals) Full() bool { return len(h.full) > 0 }

// Empty reports whether every proposal was made.
func (h HeldProposals) Empty() bool {
	return len(h.dismissed)+len(h.waiting)+len(h.full) == 0
}

package workspace

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestThreadID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		stored string
		want   ThreadID
		err    error
	}{
		{"essay-42", ThreadID{Name: "essay-42"}, nil},
		{"a.b_c:d@e-f", ThreadID{Name: "a.b_c:d@e-f"}, nil},
		{"alice~t1", ThreadID{Client: "alice", Name: "t1"}, nil},
		{strings.Repeat("x", 128), ThreadID{Name: strings.Repeat("x", 128)}, nil},
		{strings.Repeat("x", 129), ThreadID{}, ErrInvalidThreadID},
		{"", ThreadID{}, ErrInvalidThreadID},
		{"a/b", ThreadID{}, ErrInvalidThreadID},
		{"~t1", ThreadID{}, ErrInvalidClient},
		{"al:ice~t1", ThreadID{}, ErrInvalidClient},
		{"alice~", ThreadID{}, ErrInvalidThreadID},
		{"a~b~c", ThreadID{}, ErrInvalidThreadID},
	} {
		got, err := ParseThreadID(tt.stored)
		require.ErrorIs(t, err, tt.err, tt.stored)
		require.Equal(t, tt.want, got, tt.stored)
		if tt.err == nil {
			require.Equal(t, tt.stored, got.String(), "the stored form reads back")
		}
	}
	_, err := NewThreadID("alice", "t~1")
	require.ErrorIs(t, err, ErrInvalidThreadID, "a client's thread id cannot reach another namespace")
}

package source_test

import (
	"fmt"
	"testing"

	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/source/sourcetest"
)

// TestSliceConformance runs source.Slice through the source contract
// (sourcetest): bounded, exact restore.
func TestSliceConformance(t *testing.T) {
	sourcetest.Run(t, sourcetest.Features{Bounded: true}, func(t *testing.T, n int) sourcetest.Instance[string] {
		vals := make([]string, n)
		for i := range vals {
			vals[i] = fmt.Sprintf("v%d", i)
		}
		return sourcetest.Instance[string]{
			Source:  source.NewSlice(vals, 3),
			Key:     func(v string) string { return v },
			Records: vals,
		}
	})
}

// TestGeneratorConformance runs source.Generator through the source
// contract, bounded and endless.
func TestGeneratorConformance(t *testing.T) {
	gen := func(split int, seq uint64) string { return fmt.Sprintf("%d/%d", split, seq) }
	key := func(v string) string { return v }
	t.Run("Bounded", func(t *testing.T) {
		sourcetest.Run(t, sourcetest.Features{Bounded: true}, func(t *testing.T, n int) sourcetest.Instance[string] {
			const splits = 4
			per := (n + splits - 1) / splits
			var keys []string
			for sp := range splits {
				for seq := range per {
					keys = append(keys, gen(sp, uint64(seq)))
				}
			}
			return sourcetest.Instance[string]{Source: source.NewGenerator(splits, int64(per), gen), Key: key, Records: keys}
		})
	})
	t.Run("Endless", func(t *testing.T) {
		sourcetest.Run(t, sourcetest.Features{Endless: true}, func(*testing.T, int) sourcetest.Instance[string] {
			return sourcetest.Instance[string]{Source: source.NewGenerator(3, -1, gen), Key: key}
		})
	})
}

package pgorders

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Sample is a generated input order: its JSON body and, for a valid one,
// the values its row must hold.
type Sample struct {
	Body     string
	Valid    bool
	ID       string
	Customer string
	Amount   float64
	Currency string
	TS       time.Time
}

// currencies of the generated orders.
var currencies = []string{"EUR", "USD", "GBP", "CHF", "JPY", "SEK"}

// SampleOrders returns n deterministic orders (seeded by seed) of a few
// dozen customers; about one in invalidEvery is invalid (0: none) in one of
// several ways: not JSON, missing id or customer, amount ≤ 0, lower-case
// currency, amount of the wrong type, a ts that is not RFC 3339.
func SampleOrders(n, invalidEvery int, seed uint64) []Sample {
	rng := rand.New(rand.NewPCG(seed, 0x0bd5))
	out := make([]Sample, n)
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range out {
		s := Sample{ID: "o" + strconv.Itoa(i), Customer: "c" + strconv.Itoa(rng.IntN(40)),
			Amount: float64(1+rng.IntN(99_999)) / 100, Currency: currencies[rng.IntN(len(currencies))],
			TS: base.Add(time.Duration(i) * time.Second)}
		amount := strconv.FormatFloat(s.Amount, 'f', -1, 64)
		ts := s.TS.Format(time.RFC3339)
		order := func(id, cust, amount, cur, ts string) string {
			return fmt.Sprintf(`{"id":%q,"customer":%q,"amount":%s,"currency":%q,"ts":%q}`, id, cust, amount, cur, ts)
		}
		if invalidEvery > 0 && rng.IntN(invalidEvery) == 0 {
			switch rng.IntN(7) {
			case 0:
				s.Body = "not json " + s.ID
			case 1:
				s.Body = order("", s.Customer, amount, s.Currency, ts)
			case 2:
				s.Body = order(s.ID, "", amount, s.Currency, ts)
			case 3:
				s.Body = order(s.ID, s.Customer, "-"+amount, s.Currency, ts)
			case 4:
				s.Body = order(s.ID, s.Customer, amount, strings.ToLower(s.Currency), ts)
			case 5:
				s.Body = order(s.ID, s.Customer, strconv.Quote(amount), s.Currency, ts)
			default:
				s.Body = order(s.ID, s.Customer, amount, s.Currency, "yesterday")
			}
			out[i] = s
			continue
		}
		s.Valid = true
		s.Body = order(s.ID, s.Customer, amount, s.Currency, ts)
		out[i] = s
	}
	return out
}

// Bodies returns the samples' bodies, in order.
func Bodies(samples []Sample) []string {
	b := make([]string, len(samples))
	for i := range samples {
		b[i] = samples[i].Body
	}
	return b
}

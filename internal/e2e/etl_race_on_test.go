//go:build race

package e2e

// etlRace: the race detector slows the ETL job about tenfold; the ETL
// crash tests scale their input down under it.
const etlRace = true

//go:build !race

package e2e

// etlRace: see etl_race_on_test.go.
const etlRace = false

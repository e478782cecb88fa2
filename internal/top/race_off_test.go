//go:build !race

package top

const raceEnabled = false

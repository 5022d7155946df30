package faults

// Scenarios lists every scenario `deskway bench faults` can run, in the
// order they run within each round.
func Scenarios() []Scenario {
	return []Scenario{
		brokerScenario(),
		Stream(),
		Gateway(),
		DiskFull(),
		Link(),
		Clock(),
		LinkStream(),
		LinkAgent(),
		ClockJump(),
	}
}

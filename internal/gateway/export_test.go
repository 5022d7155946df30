package gateway

// LoopReaderBuffers returns, for every tunnel an event loop relays, the
// capacity of the MS-TSGU reader buffer it holds between messages, read
// on its loop's goroutine.
func (s *Server) LoopReaderBuffers() []int {
	s.mu.Lock()
	var relays []*loopRelay
	for _, tn := range s.tunnels {
		if r := tn.onLoop.Load(); r != nil {
			relays = append(relays, r)
		}
	}
	s.mu.Unlock()
	var caps []int
	for _, r := range relays {
		res := make(chan int, 1)
		if err := r.loop.Post(func() { res <- cap(r.wt.pr.buf) }); err != nil {
			continue
		}
		caps = append(caps, <-res)
	}
	return caps
}

// LoopWatchdogs counts the tunnels on event loops that hold a watchdog
// timer of their own, and the tunnels the loops' own watchdogs check.
func (s *Server) LoopWatchdogs() (timers, watched int) {
	s.mu.Lock()
	for _, tn := range s.tunnels {
		if tn.onLoop.Load() != nil && tn.watchdog.Load() != nil {
			timers++
		}
	}
	s.mu.Unlock()
	if s.loops != nil {
		for _, l := range s.loops.loops {
			l.mu.Lock()
			watched += len(l.watched)
			l.mu.Unlock()
		}
	}
	return timers, watched
}

package group

// pause holds the member's loop (no renewals, no watch handling), as a
// process stopped with SIGSTOP would be; closing the returned channel
// resumes it.
func (m *Member) pause() chan struct{} {
	resume := make(chan struct{})
	m.pauseReq <- resume
	return resume
}

package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// sink publishes one slot's outputs (or the pipeline's dead letters). Each
// sink has its own JetStream context so that a barrier can wait for exactly
// its own pending acknowledgements. Outputs of a key group are published by
// one sink, in order.
type sink struct {
	job      string
	nc       *nats.Conn
	js       jetstream.JetStream
	delivery Delivery
	subjects []string // per key group: <output.subject>.<kg>
	dlq      string
	fail     func(error)
}

func newSink(nc *nats.Conn, cfg *Config, subjects []string, fail func(error)) (*sink, error) {
	s := &sink{job: cfg.Job, nc: nc, delivery: cfg.Delivery, subjects: subjects, dlq: cfg.DeadLetterSubject, fail: fail}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(8192),
		jetstream.WithPublishAsyncTimeout(30*time.Second),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			fail(fmt.Errorf("engine: publish to %s: %w", m.Subject, err))
		}))
	if err != nil {
		return nil, err
	}
	s.js = js
	return s, nil
}

// publish sends one output of key group kg with output index idx.
// A non-zero fence is the subject's expected last sequence
// (Nats-Expected-Last-Subject-Sequence): the publish fails if another writer
// appended to the key group since.
func (s *sink) publish(kg int, idx uint64, key, value []byte, evTime int64, fence uint64) error {
	h := make(nats.Header, 4)
	h[HeaderKey] = []string{string(key)}
	h[HeaderTime] = []string{strconv.FormatInt(evTime, 10)}
	out := strconv.FormatUint(idx, 10)
	h[HeaderOut] = []string{out}
	m := &nats.Msg{Subject: s.subjects[kg], Header: h, Data: value}
	switch s.delivery {
	case Core:
		return s.nc.PublishMsg(m)
	case Dedupe:
		h[HeaderMsgID] = []string{s.job + "/" + strconv.Itoa(kg) + "/" + out}
	}
	if fence > 0 {
		_, err := s.js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second), jetstream.WithExpectLastSequencePerSubject(fence))
		return err
	}
	_, err := s.js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second))
	return err
}

// deadLetter publishes a record the job could not process, with the reason.
func (s *sink) deadLetter(h nats.Header, data []byte, stage string, seq uint64, reason error) error {
	nh := make(nats.Header, len(h)+3)
	for k, v := range h {
		nh[k] = v
	}
	nh[HeaderError] = []string{reason.Error()}
	nh[HeaderStage] = []string{stage}
	nh[HeaderSeq] = []string{strconv.FormatUint(seq, 10)}
	_, err := s.js.PublishMsgAsync(&nats.Msg{Subject: s.dlq, Header: nh, Data: data}, jetstream.WithStallWait(30*time.Second))
	return err
}

// fence returns a channel closed once every publish issued so far is acknowledged.
func (s *sink) fence() <-chan struct{} {
	if s.delivery == Core && s.js.PublishAsyncPending() == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return s.js.PublishAsyncComplete()
}

// flush waits for all pending acknowledgements (and core publishes).
func (s *sink) flush(ctx context.Context) error {
	select {
	case <-s.fence():
	case <-ctx.Done():
		return fmt.Errorf("engine: flush outputs: %d unacknowledged: %w", s.js.PublishAsyncPending(), ctx.Err())
	}
	if s.delivery == Core {
		return s.nc.FlushWithContext(ctx)
	}
	return nil
}

// ensureStreams creates the output and dead-letter streams when missing.
func ensureStreams(ctx context.Context, js jetstream.JetStream, cfg *Config) error {
	want := []jetstream.StreamConfig{{Name: cfg.DeadLetterStream, Subjects: []string{cfg.DeadLetterSubject}, Storage: jetstream.FileStorage}}
	if cfg.Delivery != Core {
		want = append(want, jetstream.StreamConfig{Name: cfg.OutputStream, Subjects: []string{cfg.OutputSubject + ".>"}, Storage: jetstream.FileStorage})
	}
	want = append(want, jetstream.StreamConfig{Name: cfg.InputStream, Subjects: cfg.InputSubjects, Storage: jetstream.FileStorage})
	for _, sc := range want {
		if _, err := js.Stream(ctx, sc.Name); err == nil {
			continue
		}
		if len(sc.Subjects) == 0 {
			return fmt.Errorf("%w: stream %s does not exist and no subjects are configured to create it", ErrConfig, sc.Name)
		}
		if _, err := js.CreateStream(ctx, sc); err != nil && !isExists(err) {
			return fmt.Errorf("engine: create stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

func isExists(err error) bool {
	return err != nil && errors.Is(err, jetstream.ErrStreamNameAlreadyInUse)
}

// lastOutput is what the output stream already holds of a key group.
type lastOutput struct {
	index      uint64 // Cairn-Out of the last output (0: none)
	subjectSeq uint64 // its stream sequence, for the publish fence
}

// readLastOutputs reads the last message of every key group's output
// subject in one pass (a last-per-subject ordered consumer).
func readLastOutputs(ctx context.Context, js jetstream.JetStream, cfg *Config) (map[int]lastOutput, error) {
	out := map[int]lastOutput{}
	prefix := cfg.OutputSubject + "."
	cons, err := js.OrderedConsumer(ctx, cfg.OutputStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + ">"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: read last outputs of %s: %w", cfg.OutputStream, err)
	}
	for {
		batch, err := cons.Fetch(1024, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("engine: read last outputs of %s: %w", cfg.OutputStream, err)
		}
		n, pending := 0, uint64(1)
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			pending = md.NumPending
			kg, err := strconv.Atoi(strings.TrimPrefix(m.Subject(), prefix))
			if err != nil || kg < 0 || kg >= cfg.KeyGroups {
				return nil, fmt.Errorf("engine: output stream %s holds subject %s, which is not <%s>.<key group < %d>: is it shared with another job or key_groups?", cfg.OutputStream, m.Subject(), cfg.OutputSubject, cfg.KeyGroups)
			}
			idx, err := strconv.ParseUint(m.Headers().Get(HeaderOut), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("engine: output %s seq %d has no valid %s header", m.Subject(), md.Sequence.Stream, HeaderOut)
			}
			out[kg] = lastOutput{index: idx, subjectSeq: md.Sequence.Stream}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("engine: read last outputs of %s: %w", cfg.OutputStream, err)
		}
		if n == 0 || pending == 0 {
			return out, nil
		}
	}
}

package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/s3blob" // registers s3://
	"gocloud.dev/gcerrors"
)

// blobStore is a Store on a gocloud.dev bucket (S3 and S3-protocol servers).
type blobStore struct {
	b *blob.Bucket
}

var _ Store = (*blobStore)(nil)

// openBlobStore opens s3://bucket/prefix?...: the URL path is a key prefix,
// the query goes to gocloud's s3blob opener unchanged.
func openBlobStore(ctx context.Context, u *url.URL) (Store, error) {
	prefix := strings.Trim(u.Path, "/")
	bu := *u
	bu.Path = ""
	bu.RawPath = ""
	b, err := blob.OpenBucket(ctx, bu.String())
	if err != nil {
		return nil, fmt.Errorf("checkpoint: open store %s://%s: %w", u.Scheme, u.Host, err)
	}
	if prefix != "" {
		b = blob.PrefixedBucket(b, prefix+"/")
	}
	return &blobStore{b: b}, nil
}

func (s *blobStore) wrap(op, name string, err error) error {
	switch gcerrors.Code(err) {
	case gcerrors.NotFound:
		return fmt.Errorf("checkpoint: %s %s: %w", op, name, ErrNotFound)
	case gcerrors.FailedPrecondition:
		if op == "create" {
			return fmt.Errorf("checkpoint: %s %s: %w", op, name, ErrExists)
		}
	}
	return fmt.Errorf("checkpoint: %s %s: %w", op, name, err)
}

func (s *blobStore) write(ctx context.Context, name string, r io.Reader, ifNotExist bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.b.NewWriter(ctx, name, &blob.WriterOptions{
		ContentType:                 "application/octet-stream",
		DisableContentTypeDetection: true,
		IfNotExist:                  ifNotExist,
	})
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		cancel() // aborts the upload: the object is not written
		w.Close()
		return err
	}
	return w.Close()
}

func (s *blobStore) Put(ctx context.Context, name string, r io.Reader) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := s.write(ctx, name, r, false); err != nil {
		return s.wrap("put", name, err)
	}
	return nil
}

// Create sends a conditional PUT (If-None-Match: *), preceded by a HEAD. The
// HEAD makes Create safe for a single writer per job on a server that
// ignores the condition; the condition makes it safe against races where
// the server honours it (AWS S3, versitygw, gofakes3).
func (s *blobStore) Create(ctx context.Context, name string, data []byte) error {
	if err := validName(name); err != nil {
		return err
	}
	if _, err := s.Stat(ctx, name); err == nil {
		return fmt.Errorf("checkpoint: create %s: %w", name, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	if err := s.write(ctx, name, bytes.NewReader(data), true); err != nil {
		return s.wrap("create", name, err)
	}
	return nil
}

func (s *blobStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	return s.GetRange(ctx, name, 0, -1)
}

func (s *blobStore) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	r, err := s.b.NewRangeReader(ctx, name, offset, length, nil)
	if err != nil {
		return nil, s.wrap("get", name, err)
	}
	return r, nil
}

func (s *blobStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	it := s.b.List(&blob.ListOptions{Prefix: prefix})
	for {
		o, err := it.Next(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return s.wrap("list", prefix, err)
		}
		if o.IsDir {
			continue
		}
		if err := fn(ObjectInfo{Name: o.Key, Size: o.Size, ModTime: o.ModTime}); err != nil {
			return err
		}
	}
}

func (s *blobStore) Delete(ctx context.Context, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := s.b.Delete(ctx, name); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return s.wrap("delete", name, err)
	}
	return nil
}

func (s *blobStore) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	if err := validName(name); err != nil {
		return ObjectInfo{}, err
	}
	a, err := s.b.Attributes(ctx, name)
	if err != nil {
		return ObjectInfo{}, s.wrap("stat", name, err)
	}
	return ObjectInfo{Name: name, Size: a.Size, ModTime: a.ModTime}, nil
}

func (s *blobStore) Close(ctx context.Context) error { return s.b.Close() }

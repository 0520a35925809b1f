package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"golang.org/x/sync/errgroup"
)

// blobStore is a Store on an S3 bucket (AWS S3 and S3-protocol servers),
// through the AWS SDK's own S3 client. s3config.go turns the store URL into
// the client.
type blobStore struct {
	client *s3.Client
	bucket string
	// prefix is "" or the URL path and "/": every key starts with it.
	prefix string
	// sse and kmsKeyID are set on every upload (ssetype=, kmskeyid=).
	sse      types.ServerSideEncryption
	kmsKeyID *string
	// checksum is the checksum declared on uploads: CRC32, or none under
	// request_checksum_calculation=when_required. A multipart upload must
	// declare it on the create, every part and the completion alike.
	checksum types.ChecksumAlgorithm
	// partSize is both the largest object sent in one PUT and the part size
	// of a multipart upload; concurrency is the parts in flight per upload.
	partSize    int64
	concurrency int
}

var _ Store = (*blobStore)(nil)

const (
	// s3PartSize and s3PartConcurrency are what gocloud's s3blob used
	// through the SDK's transfer manager (8 MiB, 5 in flight), with one
	// fewer part in flight: the writer already uploads several objects at
	// once.
	s3PartSize        = 8 << 20
	s3PartConcurrency = 4
	// s3MaxParts is S3's limit of parts per multipart upload.
	s3MaxParts = 10000
	// s3AbortTimeout bounds the abort of a failed multipart upload, which
	// runs even when the upload's context was cancelled.
	s3AbortTimeout = 30 * time.Second
)

// openBlobStore opens s3://bucket/prefix?...: the URL path is a key prefix;
// s3Params lists the query parameters.
func openBlobStore(ctx context.Context, u *url.URL) (Store, error) {
	c, err := parseS3URL(u)
	if err == nil {
		var s *blobStore
		if s, err = newBlobStore(ctx, c); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("checkpoint: open store %s://%s: %w", u.Scheme, u.Host, err)
}

func newBlobStore(ctx context.Context, c *s3Config) (*blobStore, error) {
	client, err := c.client(ctx)
	if err != nil {
		return nil, err
	}
	s := &blobStore{client: client, bucket: c.bucket, sse: c.sse, partSize: s3PartSize, concurrency: s3PartConcurrency}
	if c.prefix != "" {
		s.prefix = c.prefix + "/"
	}
	if c.kmsKeyID != "" {
		s.kmsKeyID = aws.String(c.kmsKeyID)
	}
	if c.checksumCalc != aws.RequestChecksumCalculationWhenRequired {
		s.checksum = types.ChecksumAlgorithmCrc32
	}
	return s, nil
}

// s3ErrorCode is the S3 error code of err ("NoSuchKey", ...) and the HTTP
// status of the answer, where err carries them.
func s3ErrorCode(err error) (code string, status int) {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	return code, status
}

func (s *blobStore) wrap(op, name string, err error) error {
	code, status := s3ErrorCode(err)
	switch {
	case code == "NoSuchBucket":
		return fmt.Errorf("checkpoint: %s %s: bucket %q does not exist (create it, or correct the store URL): %w", op, name, s.bucket, err)
	case code == "NoSuchKey" || code == "NotFound" || status == http.StatusNotFound:
		return fmt.Errorf("checkpoint: %s %s: %w", op, name, ErrNotFound)
	case op == "create" && (code == "PreconditionFailed" || status == http.StatusPreconditionFailed):
		return fmt.Errorf("checkpoint: %s %s: %w", op, name, ErrExists)
	case op == "create" && code == "ConditionalRequestConflict":
		// AWS S3 answers 409 to a conditional write racing another one on
		// the same key: try again, and the HEAD or the 412 decides.
		return fmt.Errorf("checkpoint: %s %s: %w", op, name, transientError{err})
	case status == http.StatusMovedPermanently || code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed":
		return fmt.Errorf("checkpoint: %s %s: the bucket %q is in another region than the one configured (set region= in the store URL, or AWS_REGION): %w", op, name, s.bucket, err)
	}
	return fmt.Errorf("checkpoint: %s %s: %w", op, name, err)
}

// write uploads r as name: one PUT up to partSize, else a multipart upload.
// With ifNotExist the PUT, or the multipart completion, carries
// If-None-Match: *. A reader that is also an io.ReaderAt and io.Seeker (a
// file, a bytes.Reader) is sent from where it stands without a copy; any
// other reader is read into buffers of partSize. A failed or cancelled
// write leaves no object.
func (s *blobStore) write(ctx context.Context, name string, r io.Reader, ifNotExist bool) error {
	key := s.prefix + name
	if ra, ok := r.(interface {
		io.ReaderAt
		io.Seeker
	}); ok {
		if off, size, err := remaining(ra); err == nil {
			if size <= s.partSize {
				return s.putObject(ctx, key, io.NewSectionReader(ra, off, size), size, ifNotExist)
			}
			partSize := max(s.partSize, (size+s3MaxParts-1)/s3MaxParts)
			pos := off
			return s.multipart(ctx, key, ifNotExist, func() (io.ReadSeeker, int64, func(), error) {
				if pos >= off+size {
					return nil, 0, nil, io.EOF
				}
				n := min(partSize, off+size-pos)
				part := io.NewSectionReader(ra, pos, n)
				pos += n
				return part, n, func() {}, nil
			})
		}
	}
	first, err := io.ReadAll(io.LimitReader(r, s.partSize))
	if err != nil {
		return err
	}
	if int64(len(first)) < s.partSize {
		return s.putObject(ctx, key, bytes.NewReader(first), int64(len(first)), ifNotExist)
	}
	// At most concurrency parts are in flight and one is being read.
	free := make(chan []byte, s.concurrency+1)
	release := func(b []byte) func() {
		return func() {
			select {
			case free <- b[:cap(b)]:
			default:
			}
		}
	}
	return s.multipart(ctx, key, ifNotExist, func() (io.ReadSeeker, int64, func(), error) {
		if first != nil {
			b := first
			first = nil
			return bytes.NewReader(b), int64(len(b)), release(b), nil
		}
		var b []byte
		select {
		case b = <-free:
		default:
			b = make([]byte, s.partSize)
		}
		n, err := io.ReadFull(r, b)
		if n == 0 && (err == io.EOF || err == nil) {
			return nil, 0, nil, io.EOF
		}
		if err != nil && err != io.ErrUnexpectedEOF {
			return nil, 0, nil, err
		}
		return bytes.NewReader(b[:n]), int64(n), release(b), nil
	})
}

// remaining is the offset of r and the number of bytes after it.
func remaining(r io.Seeker) (off, size int64, err error) {
	if off, err = r.Seek(0, io.SeekCurrent); err != nil {
		return 0, 0, err
	}
	end, err := r.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, 0, err
	}
	if _, err := r.Seek(off, io.SeekStart); err != nil {
		return 0, 0, err
	}
	return off, end - off, nil
}

func (s *blobStore) putObject(ctx context.Context, key string, body io.ReadSeeker, size int64, ifNotExist bool) error {
	in := &s3.PutObjectInput{
		Bucket:               aws.String(s.bucket),
		Key:                  aws.String(key),
		Body:                 body,
		ContentLength:        aws.Int64(size),
		ContentType:          aws.String("application/octet-stream"),
		ChecksumAlgorithm:    s.checksum,
		ServerSideEncryption: s.sse,
		SSEKMSKeyId:          s.kmsKeyID,
	}
	if ifNotExist {
		// https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html
		in.IfNoneMatch = aws.String("*")
	}
	_, err := s.client.PutObject(ctx, in)
	return err
}

// multipart uploads the parts that next returns, until io.EOF, with up to
// concurrency parts in flight; next's func releases the part's memory.
// Parts are read while earlier ones are being sent, and not after one
// failed. The upload is aborted unless it completes: S3 keeps the parts of
// an upload neither completed nor aborted (a process killed mid-upload)
// until a lifecycle rule (AbortIncompleteMultipartUpload) removes them.
func (s *blobStore) multipart(ctx context.Context, key string, ifNotExist bool, next func() (io.ReadSeeker, int64, func(), error)) (err error) {
	up, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket:               aws.String(s.bucket),
		Key:                  aws.String(key),
		ContentType:          aws.String("application/octet-stream"),
		ChecksumAlgorithm:    s.checksum,
		ServerSideEncryption: s.sse,
		SSEKMSKeyId:          s.kmsKeyID,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s3AbortTimeout)
			defer cancel()
			_, _ = s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
				Bucket: aws.String(s.bucket), Key: aws.String(key), UploadId: up.UploadId,
			})
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.concurrency)
	var mu sync.Mutex
	var parts []types.CompletedPart
	for num := int32(1); gctx.Err() == nil; num++ {
		body, n, release, rerr := next()
		if rerr == io.EOF {
			break
		}
		if rerr == nil && num > s3MaxParts {
			release()
			rerr = fmt.Errorf("more than %d parts of %d bytes: too large for one S3 object", s3MaxParts, n)
		}
		if rerr != nil {
			_ = g.Wait()
			return rerr
		}
		g.Go(func() error {
			defer release()
			out, err := s.client.UploadPart(gctx, &s3.UploadPartInput{
				Bucket:            aws.String(s.bucket),
				Key:               aws.String(key),
				UploadId:          up.UploadId,
				PartNumber:        aws.Int32(num),
				Body:              body,
				ContentLength:     aws.Int64(n),
				ChecksumAlgorithm: s.checksum,
			})
			if err != nil {
				return fmt.Errorf("part %d: %w", num, err)
			}
			p := types.CompletedPart{PartNumber: aws.Int32(num), ETag: out.ETag}
			if s.checksum == types.ChecksumAlgorithmCrc32 {
				p.ChecksumCRC32 = out.ChecksumCRC32
			}
			mu.Lock()
			parts = append(parts, p)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sort.Slice(parts, func(i, j int) bool { return *parts[i].PartNumber < *parts[j].PartNumber })
	in := &s3.CompleteMultipartUploadInput{
		Bucket:          aws.String(s.bucket),
		Key:             aws.String(key),
		UploadId:        up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	}
	if ifNotExist {
		in.IfNoneMatch = aws.String("*")
	}
	_, err = s.client.CompleteMultipartUpload(ctx, in)
	return err
}

// validName is the Store's name check, and refuses control characters:
// S3 takes them in a key but cannot return them in a listing's XML.
func (s *blobStore) validName(name string) error {
	for _, c := range []byte(name) {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("checkpoint: invalid object name %q: control character", name)
		}
	}
	return validName(name)
}

func (s *blobStore) Put(ctx context.Context, name string, r io.Reader) error {
	if err := s.validName(name); err != nil {
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
	if err := s.validName(name); err != nil {
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
	if err := s.validName(name); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("checkpoint: get %s: negative offset %d", name, offset)
	}
	in := &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + name)}
	switch {
	case length == 0:
		// S3 has no empty range: read one byte (which also checks that the
		// object exists) and return none.
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", offset, offset))
	case length > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", offset, offset+length-1))
	case offset > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", offset))
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, s.wrap("get", name, err)
	}
	if length == 0 {
		out.Body.Close()
		return http.NoBody, nil
	}
	return out.Body, nil
}

func (s *blobStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(s.prefix + prefix),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return s.wrap("list", prefix, err)
		}
		for _, o := range page.Contents {
			name := aws.ToString(o.Key)[len(s.prefix):]
			if err := fn(ObjectInfo{Name: name, Size: aws.ToInt64(o.Size), ModTime: aws.ToTime(o.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *blobStore) Delete(ctx context.Context, name string) error {
	if err := s.validName(name); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + name)})
	if err != nil {
		if err = s.wrap("delete", name, err); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

func (s *blobStore) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	if err := s.validName(name); err != nil {
		return ObjectInfo{}, err
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + name)})
	if err != nil {
		return ObjectInfo{}, s.wrap("stat", name, err)
	}
	return ObjectInfo{Name: name, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified)}, nil
}

// Close releases nothing: the client holds only idle connections.
func (s *blobStore) Close(ctx context.Context) error { return nil }

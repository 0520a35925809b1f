package checkpoint

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// s3Params are the query parameters of an s3:// store URL, with what each
// one does. They are the parameters gocloud.dev's s3blob accepted (cairn
// used it until the binary had to shrink; see docs/RATIONALE.md), with the
// same names, values and meaning, so that every URL that worked still works.
// Any other parameter is refused.
var s3Params = map[string]string{
	"region":                       "the AWS region (else AWS_REGION or the shared config)",
	"endpoint":                     "the S3 endpoint URL, e.g. http://127.0.0.1:9000 (an S3-protocol server)",
	"use_path_style":               "true: http://ENDPOINT/BUCKET/KEY instead of http://BUCKET.ENDPOINT/KEY",
	"s3ForcePathStyle":             "the same as use_path_style",
	"hostname_immutable":           "true: send to the endpoint's host unchanged (with endpoint; implies path style)",
	"disable_https":                "true: http:// for the endpoints the SDK resolves itself",
	"profile":                      "the shared config profile (else AWS_PROFILE)",
	"anonymous":                    "true: send unsigned requests (a store that allows anonymous access)",
	"role":                         "an IAM role ARN to assume through STS with the chain's credentials",
	"dualstack":                    "true: dual-stack (IPv4 and IPv6) AWS endpoints",
	"fips":                         "true: FIPS AWS endpoints",
	"accelerate":                   "true: S3 Transfer Acceleration endpoints",
	"ssetype":                      "server-side encryption of written objects: AES256, aws:kms or aws:kms:dsse",
	"kmskeyid":                     "the KMS key of ssetype=aws:kms",
	"rate_limiter_capacity":        "the capacity of the SDK's client-side retry token bucket (default: no limit)",
	"request_checksum_calculation": "when_supported (default) or when_required: when_required sends no CRC32 with uploads, for servers that refuse it",
	"response_checksum_validation": "when_supported (default) or when_required",
	"awssdk":                       "ignored (gocloud's choice of AWS SDK version; only v2 exists here)",
}

// s3Config is a parsed s3:// store URL.
type s3Config struct {
	bucket string
	// prefix is "" or the URL path without slashes at either end.
	prefix string

	region, endpoint, profile, role string
	usePathStyle, hostnameImmutable bool
	disableHTTPS, anonymous         bool
	dualStack, fips, accelerate     bool
	rateLimit                       int64
	checksumCalc                    aws.RequestChecksumCalculation
	checksumValidation              aws.ResponseChecksumValidation
	sse                             types.ServerSideEncryption
	kmsKeyID                        string
}

// parseS3URL reads s3://BUCKET[/PREFIX][?PARAMS]. Errors name the parameter,
// the value and what is accepted.
func parseS3URL(u *url.URL) (*s3Config, error) {
	c := &s3Config{bucket: u.Host, prefix: strings.Trim(u.Path, "/")}
	if c.bucket == "" {
		return nil, fmt.Errorf("the URL names no bucket: want s3://BUCKET[/PREFIX][?endpoint=...&region=...]")
	}
	q := u.Query()
	names := make([]string, 0, len(q))
	for k := range q {
		names = append(names, k)
	}
	sort.Strings(names)
	boolean := func(name, v string) (bool, error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("parameter %s=%q: want true or false", name, v)
		}
		return b, nil
	}
	for _, name := range names {
		v := q.Get(name)
		var err error
		switch name {
		case "region":
			c.region = v
		case "endpoint":
			e, perr := url.Parse(v)
			if perr != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
				return nil, fmt.Errorf("parameter endpoint=%q: want a URL such as http://127.0.0.1:9000 or https://s3.example.com", v)
			}
			c.endpoint = v
		case "use_path_style", "s3ForcePathStyle":
			var b bool
			if b, err = boolean(name, v); b {
				c.usePathStyle = true
			}
		case "hostname_immutable":
			c.hostnameImmutable, err = boolean(name, v)
		case "disable_https":
			c.disableHTTPS, err = boolean(name, v)
		case "profile":
			c.profile = v
		case "anonymous":
			c.anonymous, err = boolean(name, v)
		case "role":
			if !strings.HasPrefix(v, "arn:") {
				return nil, fmt.Errorf("parameter role=%q: want an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)", v)
			}
			c.role = v
		case "dualstack":
			c.dualStack, err = boolean(name, v)
		case "fips":
			c.fips, err = boolean(name, v)
		case "accelerate":
			c.accelerate, err = boolean(name, v)
		case "ssetype":
			for _, t := range types.ServerSideEncryptionAes256.Values() {
				if strings.EqualFold(string(t), v) {
					c.sse = t
				}
			}
			if c.sse == "" {
				return nil, fmt.Errorf("parameter ssetype=%q: want one of %v", v, types.ServerSideEncryptionAes256.Values())
			}
		case "kmskeyid":
			c.kmsKeyID = v
		case "rate_limiter_capacity":
			n, perr := strconv.ParseInt(v, 10, 32)
			if perr != nil || n < 0 {
				return nil, fmt.Errorf("parameter rate_limiter_capacity=%q: want a whole number of retry tokens (0: no limit)", v)
			}
			c.rateLimit = n
		case "request_checksum_calculation":
			switch strings.ToLower(v) {
			case "when_supported":
				c.checksumCalc = aws.RequestChecksumCalculationWhenSupported
			case "when_required":
				c.checksumCalc = aws.RequestChecksumCalculationWhenRequired
			default:
				return nil, fmt.Errorf("parameter %s=%q: want when_supported or when_required", name, v)
			}
		case "response_checksum_validation":
			switch strings.ToLower(v) {
			case "when_supported":
				c.checksumValidation = aws.ResponseChecksumValidationWhenSupported
			case "when_required":
				c.checksumValidation = aws.ResponseChecksumValidationWhenRequired
			default:
				return nil, fmt.Errorf("parameter %s=%q: want when_supported or when_required", name, v)
			}
		case "awssdk":
		default:
			known := make([]string, 0, len(s3Params))
			for k := range s3Params {
				known = append(known, k)
			}
			sort.Strings(known)
			return nil, fmt.Errorf("unknown parameter %q (known: %s)", name, strings.Join(known, ", "))
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

// client builds the S3 client: the AWS SDK's default configuration chain
// (credentials from the environment, the shared config and credentials
// files, SSO, web identity, the container endpoint, then EC2 instance
// metadata unless AWS_EC2_METADATA_DISABLED=true; internal/app/cli/awscreds.go
// names the link that will be used), adjusted by the URL.
func (c *s3Config) client(ctx context.Context) (*s3.Client, error) {
	var opts []func(*config.LoadOptions) error
	if c.region != "" {
		opts = append(opts, config.WithRegion(c.region))
	}
	if c.profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(c.profile))
	}
	if c.anonymous {
		opts = append(opts, config.WithCredentialsProvider(aws.AnonymousCredentials{}))
	}
	if c.dualStack {
		opts = append(opts, config.WithUseDualStackEndpoint(aws.DualStackEndpointStateEnabled))
	}
	if c.fips {
		opts = append(opts, config.WithUseFIPSEndpoint(aws.FIPSEndpointStateEnabled))
	}
	if c.checksumCalc != 0 {
		opts = append(opts, config.WithRequestChecksumCalculation(c.checksumCalc))
	}
	if c.checksumValidation != 0 {
		opts = append(opts, config.WithResponseChecksumValidation(c.checksumValidation))
	}
	// The SDK's standard retryer (3 attempts) without its client-side retry
	// quota, as gocloud configured it: a burst of 5xx answers must not turn
	// into "retry quota exceeded". RetryStore retries on top of it.
	var limiter retry.RateLimiter = ratelimit.None
	if c.rateLimit > 0 {
		limiter = ratelimit.NewTokenRateLimit(uint(c.rateLimit))
	}
	opts = append(opts, config.WithRetryer(func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) { o.RateLimiter = limiter })
	}))
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, fmt.Errorf("no AWS region: add region=... to the store URL, or set AWS_REGION (any region, e.g. us-east-1, for an S3-protocol server)")
	}
	if c.role != "" {
		// The chain's credentials (or the URL's profile) sign the STS call.
		cfg.Credentials = aws.NewCredentialsCache(stscreds.NewAssumeRoleProvider(sts.NewFromConfig(cfg), c.role))
	}
	return s3.NewFromConfig(cfg, func(o *s3.Options) {
		if c.endpoint != "" {
			o.BaseEndpoint = aws.String(c.endpoint)
			// An immutable host cannot carry the bucket: it goes in the path.
			o.UsePathStyle = c.usePathStyle || c.hostnameImmutable
		} else {
			o.UsePathStyle = c.usePathStyle
		}
		o.UseAccelerate = c.accelerate
		o.EndpointOptions.DisableHTTPS = c.disableHTTPS
		// Otherwise the SDK prints a warning to stderr for each download
		// of a multipart object (no whole-object checksum to validate).
		// Every object a restore reads is checked against the manifest's
		// size and SHA-256 anyway.
		o.DisableLogOutputChecksumValidationSkipped = true
	}), nil
}

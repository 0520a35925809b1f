package runtime

import (
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
)

// awsCredentialSource says where the AWS SDK's default chain will take the
// credentials of an s3:// store from, by looking only at the URL, the
// environment and the shared files: nothing is asked over the network (the
// chain's last link, the EC2 instance metadata service, is a network call
// to 169.254.169.254). none is true when no link before that one is
// configured. Same order as aws-sdk-go-v2's config.LoadDefaultConfig.
func awsCredentialSource(storeURL string, getenv func(string) string) (source string, none bool) {
	q := url.Values{}
	if u, err := url.Parse(storeURL); err == nil {
		q = u.Query()
	}
	role := ""
	if r := q.Get("role"); r != "" {
		role = ", then assumes role " + r
	}
	if q.Get("anonymous") == "true" {
		return "anonymous (the store URL says anonymous=true: requests are not signed)", false
	}
	if getenv("AWS_ACCESS_KEY_ID") != "" && getenv("AWS_SECRET_ACCESS_KEY") != "" {
		return "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)" + role, false
	}
	profile := q.Get("profile")
	if profile == "" {
		profile = getenv("AWS_PROFILE")
	}
	if profile != "" {
		return "shared config, profile " + profile + role, false
	}
	home := getenv("HOME")
	for _, f := range []struct{ env, def string }{{"AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"}, {"AWS_CONFIG_FILE", ".aws/config"}} {
		p := getenv(f.env)
		if p == "" && home != "" {
			p = filepath.Join(home, f.def)
		}
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return "shared config file " + p + " (profile default)" + role, false
		}
	}
	if getenv("AWS_WEB_IDENTITY_TOKEN_FILE") != "" {
		return "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)" + role, false
	}
	if getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") != "" || getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI") != "" {
		return "container credentials endpoint (AWS_CONTAINER_CREDENTIALS_*)" + role, false
	}
	if getenv("AWS_EC2_METADATA_DISABLED") == "true" {
		return "none: no credentials configured and the EC2 instance metadata service disabled (AWS_EC2_METADATA_DISABLED=true)", true
	}
	return "EC2 instance metadata (169.254.169.254): no credentials configured in the URL, the environment or the shared files", true
}

// logAWSCredentials says at start which link of the AWS credential chain an
// s3:// store uses. With nothing configured the SDK falls back to the EC2
// instance metadata service, a network call a device off the cloud does not
// expect: that is a warning naming AWS_EC2_METADATA_DISABLED.
func logAWSCredentials(log *slog.Logger, storeURL string, getenv func(string) string) {
	src, none := awsCredentialSource(storeURL, getenv)
	if !none {
		log.Info("s3 store: AWS credentials", "chain", src)
		return
	}
	if getenv("AWS_EC2_METADATA_DISABLED") == "true" {
		log.Warn("s3 store: no AWS credentials configured and instance metadata disabled: requests to the store will fail; give credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, a shared credentials file), or add anonymous=true to the URL of a store that allows anonymous access", "chain", src)
		return
	}
	log.Warn("s3 store: no AWS credentials configured; the AWS SDK will ask the EC2 instance metadata service (169.254.169.254) for them. "+
		"Off EC2, set AWS_EC2_METADATA_DISABLED=true and give credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a shared credentials file)", "chain", src)
}

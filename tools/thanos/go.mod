// The build module of Thanos (scripts/install-tools.sh copies it under .tools/build/ and runs
// `go get github.com/thanos-io/thanos/cmd/thanos@$THANOS_MODULE_VERSION` there, which writes the
// require lines). Thanos's go.mod has `replace` directives, which apply only in the main module:
// `go install github.com/thanos-io/thanos/cmd/thanos@v0.42.5` fails for want of them, so they are
// restated here, as in Thanos v0.42.5's go.mod. A new THANOS_MODULE_VERSION in tools/versions.env
// may change them: compare with that release's go.mod.
module phasetrace.local/thanos-build

go 1.26.10

replace (
	capnproto.org/go/capnp/v3 => capnproto.org/go/capnp/v3 v3.0.0-alpha.30
	github.com/bradfitz/gomemcache => github.com/themihai/gomemcache v0.0.0-20180902122335-24332e2d58ab
	github.com/sercand/kuberesolver/v4 => github.com/sercand/kuberesolver/v5 v5.1.1
	github.com/vimeo/galaxycache => github.com/thanos-community/galaxycache v0.0.0-20211122094458-3a32041a1f1e
	gopkg.in/alecthomas/kingpin.v2 => github.com/alecthomas/kingpin v1.3.8-0.20210301060133-17f40c25f497
	zenhack.net/go/util => github.com/zenhack/go-util v0.0.0-20231005031245-66f5419c2aea
)

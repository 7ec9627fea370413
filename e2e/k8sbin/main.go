// Command k8s is a multicall ("hyperkube"-style) binary for kvpilot's e2e
// control plane. Each component runs in its own process; this binary only
// bundles the upstream command constructors so one link serves them all.
//
//	k8s etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl [flags]
//
// or, via a symlink named after the component, `kube-apiserver [flags]`.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = "usage: k8s etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl [flags]"

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "k8s" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	// cobra and kubectl's plugin handler read os.Args directly.
	os.Args = append([]string{name}, args...)
	switch name {
	case "etcd":
		os.Exit(runEtcd(args))
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(kcm.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubectl":
		os.Exit(cli.Run(kubectlcmd.NewDefaultKubectlCommand()))
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}

// runEtcd starts a single-member, throw-away etcd (no fsync) and serves until
// SIGINT/SIGTERM. Same idea as k8s.io/apiserver's etcd3/testserver.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ExitOnError)
	dir := fs.String("data-dir", "", "data directory (required)")
	client := fs.String("client-url", "http://127.0.0.1:2379", "client listen/advertise URL")
	peer := fs.String("peer-url", "http://127.0.0.1:2380", "peer listen/advertise URL")
	metrics := fs.String("metrics-url", "", "optional separate metrics listen URL")
	logLevel := fs.String("log-level", "warn", "zap log level")
	quota := fs.Int64("quota-backend-bytes", 2<<30, "backend quota in bytes")
	_ = fs.Parse(args)
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cu, err := url.Parse(*client)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd: bad --client-url:", err)
		return 2
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd: bad --peer-url:", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = "e2e"
	cfg.Dir = *dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	if *metrics != "" {
		mu, err := url.Parse(*metrics)
		if err != nil {
			fmt.Fprintln(os.Stderr, "etcd: bad --metrics-url:", err)
			return 2
		}
		cfg.ListenMetricsUrls = []url.URL{*mu}
	}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true // throw-away test data only
	cfg.QuotaBackendBytes = *quota
	cfg.LogLevel = *logLevel
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
	defer e.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: ready, serving clients on", cu.String())
	case <-ctx.Done():
		return 0
	}
	select {
	case <-ctx.Done():
		return 0
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
}

package keyserver

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	redemptions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_otp_redemptions_total",
		Help: "Requests to redeem a one-time token, by outcome: redeemed, unknown (never issued or already used), expired, ended (its task ended or moved on), malformed, busy (the key index was not current and its budget of apiserver reads was spent, or the redemption waited too long for a turn at the apiserver; try again), failed (the apiserver could not be asked; the key is kept).",
	}, []string{"outcome"})
	stored = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_otp_keys_stored_total",
		Help: "Private keys kept for one-time redemption, by who stored them: controller (a task's key) or store-key (POST /store-key).",
	}, []string{"via"})
	withdrawn = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_otp_keys_withdrawn_total",
		Help: "Kept keys deleted without being redeemed, by reason: revoked (their task ended or its secret was tampered with), expired or ended (found by the sweeper).",
	}, []string{"reason"})
	storeKeyRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_otp_store_key_refusals_total",
		Help: "Refused POST /store-key requests, by reason: disabled, unauthenticated, forbidden.",
	}, []string{"reason"})
	refusedFromMemory = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "berth_otp_replays_refused_total",
		Help: "Redemptions of a retried task's token refused without a request to the apiserver: the attempt its TaskRun is in redeemed the key already, or that attempt's window passed (also counted in berth_otp_redemptions_total).",
	})
	turnWaits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "berth_otp_turn_waits_total",
		Help: "Redemptions that found every slot at the apiserver taken and waited for their namespace's turn (--otp-concurrency); those that waited too long are counted as busy in berth_otp_redemptions_total.",
	})
	throttled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_otp_throttled_total",
		Help: "Requests answered 429 before they were read, by the limit they met: source-rate, source-concurrency (one address).",
	}, []string{"limit"})
)

func init() {
	metrics.Registry.MustRegister(redemptions, stored, withdrawn, storeKeyRefusals, throttled, refusedFromMemory, turnWaits)
}

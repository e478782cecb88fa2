//go:build vtprotobuf

package service

import "testing"

// BenchmarkCodecVT measures go-control-plane's vtprotobuf encoder, compiled only with
// -tags vtprotobuf; its figures sit beside BenchmarkCodec/marshal/proto.
func BenchmarkCodecVT(b *testing.B) {
	resp := benchResponse()
	b.Run("marshal/vt", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := resp.MarshalVTStrict(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

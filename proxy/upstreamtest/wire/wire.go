// Package wire writes the wire APIs' answers as their servers do, for the three models that
// stand in for them in wsproxy: the demo model (proxy/demo), the scripted upstream
// (proxy/upstreamtest) and the configurable fake (proxy/upstreamtest/fake). One writer an API:
// the models differ in what they answer, never in how it is written. It knows nothing of
// wsproxy's insides (docs/architecture.md's table).
package wire

import "net/http"

// Event is a server-sent event of data alone, ended by CRLF CRLF as the Gemini API ends its.
func Event(data []byte) []byte {
	b := make([]byte, 0, len(data)+10)
	b = append(b, "data: "...)
	b = append(b, data...)
	return append(b, "\r\n\r\n"...)
}

// WriteJSON answers status with a JSON body.
func WriteJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ferry-gcs: a Google Cloud Storage emulator for Ferry's tests.
//
// fake-gcs-server's storage (github.com/fsouza/fake-gcs-server/fakestorage) serves the JSON
// API and the XML reads (GET, HEAD, ranges, list with prefix and delimiter, DELETE). The XML
// API is all object_store speaks, and fake-gcs-server answers its writes with 400 "invalid
// uploadType". This program puts fakestorage behind a handler that serves those writes itself,
// on the same storage, as GCS's XML API does:
//
//	PUT    /b/o                      x-goog-if-generation-match (0 = create only), x-goog-meta-*
//	PUT    /b/o  x-goog-copy-source  server-side copy (metadata copied), the same precondition
//	POST   /b/o?uploads              multipart upload: start
//	PUT    /b/o?partNumber&uploadId  a part (kept in memory until completed or aborted)
//	POST   /b/o?uploadId             complete: the object appears whole, or not at all
//	DELETE /b/o?uploadId             abort
//	GET    /b?uploads                uploads not completed nor aborted (as GCS lists them)
//	GET    /b/o  If-Match / If-None-Match   412 / 304 (fakestorage ignores them)
//
// Any Host header is accepted (clients reach it through a fault proxy on another port): the
// handler presents fakestorage with the public host it was started with.
package main

import (
	"bytes"
	"crypto/md5"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

const s3ns = "http://s3.amazonaws.com/doc/2006-03-01/"

// The largest body accepted in one request: parts and single PUTs of the tests are far smaller.
const maxBody = 1 << 30

type upload struct {
	bucket, name string
	contentType  string
	meta         map[string]string
	initiated    time.Time
	parts        map[int][]byte
	etags        map[int]string
}

type emulator struct {
	srv        *fakestorage.Server
	inner      http.Handler
	publicHost string

	// One lock for every write served here: a precondition is checked and the write made
	// under it, so two conditional creates of one name cannot both succeed.
	mu         sync.Mutex
	uploads    map[string]*upload
	generation int64
}

func main() {
	host := flag.String("host", "127.0.0.1", "address to listen on")
	port := flag.Int("port", 0, "port to listen on (0: any free port, printed on stdout)")
	scheme := flag.String("scheme", "http", "http or https")
	cert := flag.String("cert", "", "PEM certificate (https)")
	key := flag.String("key", "", "PEM private key (https)")
	buckets := flag.String("buckets", "ferry", "comma-separated buckets to create")
	flag.Parse()

	ln, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		log.Fatalf("ferry-gcs: listen: %v", err)
	}
	addr := ln.Addr().String()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		NoListener:  true,
		Scheme:      *scheme,
		PublicHost:  addr,
		ExternalURL: *scheme + "://" + addr,
		Writer:      io.Discard,
	})
	if err != nil {
		log.Fatalf("ferry-gcs: %v", err)
	}
	for _, b := range strings.Split(*buckets, ",") {
		if b = strings.TrimSpace(b); b != "" {
			srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: b})
		}
	}
	e := &emulator{srv: srv, inner: srv.HTTPHandler(), publicHost: addr, uploads: map[string]*upload{}}
	fmt.Printf("%s://%s\n", *scheme, addr)
	hs := &http.Server{Handler: e, ReadHeaderTimeout: 30 * time.Second}
	if *scheme == "https" {
		err = hs.ServeTLS(ln, *cert, *key)
	} else {
		err = hs.Serve(ln)
	}
	log.Fatalf("ferry-gcs: %v", err)
}

func (e *emulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Host = e.publicHost
	p := r.URL.EscapedPath()
	for _, api := range []string{"/storage/", "/upload/", "/download/", "/batch/", "/_internal/"} {
		if strings.HasPrefix(p, api) {
			e.inner.ServeHTTP(w, r)
			return
		}
	}
	bucket, object, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	name, err := url.PathUnescape(object)
	if err != nil {
		xmlError(w, http.StatusBadRequest, "InvalidArgument", "object name: "+err.Error())
		return
	}
	q := r.URL.Query()
	switch {
	case name == "" && r.Method == http.MethodGet && q.Has("uploads"):
		e.listUploads(w, bucket, q.Get("prefix"))
	case name == "":
		e.inner.ServeHTTP(w, r)
	case r.Method == http.MethodPut && q.Has("uploadId"):
		e.putPart(w, r, q)
	case r.Method == http.MethodPut && r.Header.Get("x-goog-copy-source") != "":
		e.copy(w, r, bucket, name)
	case r.Method == http.MethodPut:
		e.put(w, r, bucket, name)
	case r.Method == http.MethodPost && q.Has("uploads"):
		e.initiate(w, r, bucket, name)
	case r.Method == http.MethodPost && q.Has("uploadId"):
		e.complete(w, r, bucket, name, q.Get("uploadId"))
	case r.Method == http.MethodDelete && q.Has("uploadId"):
		e.abort(w, q.Get("uploadId"))
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && !e.preconditionsMet(w, r, bucket, name):
	default:
		e.inner.ServeHTTP(w, r)
	}
}

// preconditionsMet answers 304 or 412 itself where If-None-Match or If-Match says so.
func (e *emulator) preconditionsMet(w http.ResponseWriter, r *http.Request, bucket, name string) bool {
	match, noneMatch := r.Header.Get("If-Match"), r.Header.Get("If-None-Match")
	if match == "" && noneMatch == "" {
		return true
	}
	obj, err := e.srv.GetObject(bucket, name)
	if err != nil {
		return true // the inner handler answers 404
	}
	etag := strconv.Quote(obj.Etag)
	if match != "" && match != "*" && match != etag {
		xmlError(w, http.StatusPreconditionFailed, "PreconditionFailed", "If-Match: the ETag is "+etag)
		return false
	}
	if noneMatch != "" && (noneMatch == "*" || noneMatch == etag) {
		w.Header().Set("ETag", etag)
		w.WriteHeader(http.StatusNotModified)
		return false
	}
	return true
}

func (e *emulator) put(w http.ResponseWriter, r *http.Request, bucket, name string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		xmlError(w, http.StatusBadRequest, "IncompleteBody", err.Error())
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.generationMatches(w, r, bucket, name) {
		return
	}
	obj, err := e.create(bucket, name, r.Header.Get("Content-Type"), metadata(r.Header), body)
	if err != nil {
		xmlError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	writtenHeaders(w, obj)
	w.WriteHeader(http.StatusOK)
}

func (e *emulator) copy(w http.ResponseWriter, r *http.Request, bucket, name string) {
	src := strings.TrimPrefix(r.Header.Get("x-goog-copy-source"), "/")
	srcBucket, srcObject, _ := strings.Cut(src, "/")
	srcName, err := url.PathUnescape(srcObject)
	if err != nil {
		xmlError(w, http.StatusBadRequest, "InvalidArgument", "x-goog-copy-source: "+err.Error())
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	from, err := e.srv.GetObject(srcBucket, srcName)
	if err != nil {
		xmlError(w, http.StatusNotFound, "NoSuchKey", "the copy source does not exist: "+src)
		return
	}
	if !e.generationMatches(w, r, bucket, name) {
		return
	}
	obj, err := e.create(bucket, name, from.ContentType, from.Metadata, from.Content)
	if err != nil {
		xmlError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	writtenHeaders(w, obj)
	writeXML(w, struct {
		XMLName      xml.Name `xml:"CopyObjectResult"`
		ETag         string   `xml:"ETag"`
		LastModified string   `xml:"LastModified"`
	}{ETag: strconv.Quote(obj.Etag), LastModified: obj.Updated.UTC().Format(time.RFC3339Nano)})
}

func (e *emulator) initiate(w http.ResponseWriter, r *http.Request, bucket, name string) {
	id := randomID()
	e.mu.Lock()
	e.uploads[id] = &upload{
		bucket: bucket, name: name, contentType: r.Header.Get("Content-Type"), meta: metadata(r.Header),
		initiated: time.Now(), parts: map[int][]byte{}, etags: map[int]string{},
	}
	e.mu.Unlock()
	writeXML(w, struct {
		XMLName  xml.Name `xml:"InitiateMultipartUploadResult"`
		Xmlns    string   `xml:"xmlns,attr"`
		Bucket   string   `xml:"Bucket"`
		Key      string   `xml:"Key"`
		UploadID string   `xml:"UploadId"`
	}{Xmlns: s3ns, Bucket: bucket, Key: name, UploadID: id})
}

func (e *emulator) putPart(w http.ResponseWriter, r *http.Request, q url.Values) {
	n, err := strconv.Atoi(q.Get("partNumber"))
	if err != nil || n < 1 || n > 10000 {
		xmlError(w, http.StatusBadRequest, "InvalidArgument", "partNumber must be 1..10000")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		xmlError(w, http.StatusBadRequest, "IncompleteBody", err.Error())
		return
	}
	sum := md5.Sum(body)
	etag := strconv.Quote(hex.EncodeToString(sum[:]))
	e.mu.Lock()
	defer e.mu.Unlock()
	u, ok := e.uploads[q.Get("uploadId")]
	if !ok {
		xmlError(w, http.StatusNotFound, "NoSuchUpload", "no such upload: "+q.Get("uploadId"))
		return
	}
	u.parts[n], u.etags[n] = body, etag
	w.Header().Set("ETag", etag)
	w.WriteHeader(http.StatusOK)
}

func (e *emulator) complete(w http.ResponseWriter, r *http.Request, bucket, name, id string) {
	var req struct {
		Parts []struct {
			PartNumber int    `xml:"PartNumber"`
			ETag       string `xml:"ETag"`
		} `xml:"Part"`
	}
	if err := xml.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		xmlError(w, http.StatusBadRequest, "MalformedXML", err.Error())
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	u, ok := e.uploads[id]
	if !ok || u.bucket != bucket || u.name != name {
		xmlError(w, http.StatusNotFound, "NoSuchUpload", "no such upload: "+id)
		return
	}
	if len(req.Parts) == 0 {
		xmlError(w, http.StatusBadRequest, "MalformedXML", "no parts")
		return
	}
	var content bytes.Buffer
	last := 0
	for _, p := range req.Parts {
		if p.PartNumber <= last {
			xmlError(w, http.StatusBadRequest, "InvalidPartOrder", "parts must be in ascending order")
			return
		}
		last = p.PartNumber
		data, ok := u.parts[p.PartNumber]
		if !ok || strings.Trim(p.ETag, `"`) != strings.Trim(u.etags[p.PartNumber], `"`) {
			xmlError(w, http.StatusBadRequest, "InvalidPart", fmt.Sprintf("part %d was not uploaded with that ETag", p.PartNumber))
			return
		}
		content.Write(data)
	}
	obj, err := e.create(bucket, name, u.contentType, u.meta, content.Bytes())
	if err != nil {
		xmlError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	delete(e.uploads, id)
	writtenHeaders(w, obj)
	writeXML(w, struct {
		XMLName xml.Name `xml:"CompleteMultipartUploadResult"`
		Xmlns   string   `xml:"xmlns,attr"`
		Bucket  string   `xml:"Bucket"`
		Key     string   `xml:"Key"`
		ETag    string   `xml:"ETag"`
	}{Xmlns: s3ns, Bucket: bucket, Key: name, ETag: strconv.Quote(obj.Etag)})
}

func (e *emulator) abort(w http.ResponseWriter, id string) {
	e.mu.Lock()
	_, ok := e.uploads[id]
	delete(e.uploads, id)
	e.mu.Unlock()
	if !ok {
		xmlError(w, http.StatusNotFound, "NoSuchUpload", "no such upload: "+id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (e *emulator) listUploads(w http.ResponseWriter, bucket, prefix string) {
	type item struct {
		Key       string `xml:"Key"`
		UploadID  string `xml:"UploadId"`
		Initiated string `xml:"Initiated"`
	}
	var items []item
	e.mu.Lock()
	for id, u := range e.uploads {
		if u.bucket == bucket && strings.HasPrefix(u.name, prefix) {
			items = append(items, item{u.name, id, u.initiated.UTC().Format(time.RFC3339Nano)})
		}
	}
	e.mu.Unlock()
	sort.Slice(items, func(i, j int) bool { return items[i].Key+items[i].UploadID < items[j].Key+items[j].UploadID })
	writeXML(w, struct {
		XMLName xml.Name `xml:"ListMultipartUploadsResult"`
		Xmlns   string   `xml:"xmlns,attr"`
		Bucket  string   `xml:"Bucket"`
		Prefix  string   `xml:"Prefix"`
		Uploads []item   `xml:"Upload"`
	}{Xmlns: s3ns, Bucket: bucket, Prefix: prefix, Uploads: items})
}

// generationMatches checks x-goog-if-generation-match (0: the object must not exist), with
// e.mu held, and answers 412 where it fails.
func (e *emulator) generationMatches(w http.ResponseWriter, r *http.Request, bucket, name string) bool {
	want := r.Header.Get("x-goog-if-generation-match")
	if want == "" {
		return true
	}
	g, err := strconv.ParseInt(want, 10, 64)
	if err != nil {
		xmlError(w, http.StatusBadRequest, "InvalidArgument", "x-goog-if-generation-match: "+want)
		return false
	}
	var current int64
	if obj, err := e.srv.GetObject(bucket, name); err == nil {
		current = obj.Generation
	}
	if current != g {
		xmlError(w, http.StatusPreconditionFailed, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.")
		return false
	}
	return true
}

// create writes an object whole, with e.mu held; generations only grow, even within one µs.
func (e *emulator) create(bucket, name, contentType string, meta map[string]string, content []byte) (fakestorage.Object, error) {
	gen := time.Now().UnixMicro()
	if gen <= e.generation {
		gen = e.generation + 1
	}
	e.generation = gen
	sum := md5.Sum(content)
	crc := crc32.Checksum(content, crc32.MakeTable(crc32.Castagnoli))
	crcBytes := []byte{byte(crc >> 24), byte(crc >> 16), byte(crc >> 8), byte(crc)}
	if contentType == "" {
		contentType = "application/octet-stream"
	}
	now := time.Now()
	obj := fakestorage.Object{
		ObjectAttrs: fakestorage.ObjectAttrs{
			BucketName: bucket, Name: name, Size: int64(len(content)), ContentType: contentType,
			Md5Hash: base64.StdEncoding.EncodeToString(sum[:]), Crc32c: base64.StdEncoding.EncodeToString(crcBytes),
			Etag: base64.StdEncoding.EncodeToString(sum[:]), Created: now, Updated: now, Generation: gen, Metadata: meta,
		},
		Content: content,
	}
	if err := e.srv.CreateObjectStreaming(obj.StreamingObject()); err != nil {
		return fakestorage.Object{}, err
	}
	return obj, nil
}

func metadata(h http.Header) map[string]string {
	meta := map[string]string{}
	for k, v := range h {
		if rest, ok := strings.CutPrefix(strings.ToLower(k), "x-goog-meta-"); ok && len(v) > 0 {
			meta[rest] = v[0]
		}
	}
	return meta
}

func writtenHeaders(w http.ResponseWriter, obj fakestorage.Object) {
	w.Header().Set("ETag", strconv.Quote(obj.Etag))
	w.Header().Set("x-goog-generation", strconv.FormatInt(obj.Generation, 10))
	w.Header().Set("x-goog-metageneration", "1")
	w.Header().Set("Last-Modified", obj.Updated.UTC().Format(http.TimeFormat))
}

func writeXML(w http.ResponseWriter, v any) {
	out, err := xml.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append([]byte(xml.Header), out...))
}

func xmlError(w http.ResponseWriter, status int, code, message string) {
	out, _ := xml.Marshal(struct {
		XMLName xml.Name `xml:"Error"`
		Code    string   `xml:"Code"`
		Message string   `xml:"Message"`
	}{Code: code, Message: message})
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	_, _ = w.Write(append([]byte(xml.Header), out...))
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
